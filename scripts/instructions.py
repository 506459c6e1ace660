#!/usr/bin/env python3
"""Client instructions per acquire+release cycle, a cost that a noisy machine cannot move:
each subject of each backend (the distlock driver and the baselines measured beside it) runs
alone in its own `lock-bench --only` process under `valgrind --tool=callgrind`, at two
iteration counts of the uncontended scenario; the difference of the two processes' totals,
divided by the difference of cycles, is what one cycle costs the client (start-up and the
connection cancel out). Prints a markdown table with each subject's ratio to the backend's
first baseline (its floor). Needs the servers of `scripts/services.sh up` for networked
backends and valgrind (`scripts/services.sh install` has it).

    scripts/instructions.py [--iterations 500,1000] [--bin target/release/lock-bench] BACKEND...

The server's own work is not counted (another process); see lock-bench's "server
requests/op" column for it.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


def labels(binary, backend):
    """The subjects of `backend`, baselines first, from a short ordinary run."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "--backend", backend, "--scenarios", "uncontended",
                        "--runs", "1", "--iterations", "5", "--json", f.name],
                       check=True, stdout=subprocess.DEVNULL)
        rows = json.load(open(f.name))
    rows.sort(key=lambda r: not r["baseline"])
    return [(r["subject"], r["baseline"]) for r in rows]


def instructions(binary, backend, label, cycles):
    """The callgrind total of one process measuring `label` alone for `cycles` cycles."""
    with tempfile.TemporaryDirectory() as d:
        run = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={d}/cg.out",
             binary, "--backend", backend, "--scenarios", "uncontended", "--runs", "1",
             "--iterations", str(cycles), "--only", label, "--json", f"{d}/out.json"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=True)
    found = re.search(r"Collected : (\d+)", run.stderr)
    if not found:
        sys.exit(f"instructions: no callgrind total for {backend} {label!r}")
    return int(found.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iterations", default="500,1000",
                   help="two cycle counts, comma separated (default 500,1000)")
    p.add_argument("--bin", default="target/release/lock-bench")
    p.add_argument("backends", nargs="+")
    a = p.parse_args()
    n1, n2 = (int(n) for n in a.iterations.split(","))
    if not n2 > n1 > 0:
        sys.exit("instructions: --iterations wants two counts, the second larger")
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"instructions: no {a.bin} (cargo build --release -p lock-bench)")
    print("| backend | subject | instructions per cycle | vs floor |")
    print("|---|---|---:|---:|")
    for backend in a.backends:
        floor = None
        for label, baseline in labels(a.bin, backend):
            per = (instructions(a.bin, backend, label, n2)
                   - instructions(a.bin, backend, label, n1)) / (n2 - n1)
            if floor is None and baseline:
                floor = per
            ratio = "floor" if per == floor else (f"{per / floor:.2f}×" if floor else "–")
            print(f"| {backend} | {label} | {per:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
