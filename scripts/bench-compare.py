#!/usr/bin/env python3
"""Before/after: runs two lock-bench binaries alternately on the same servers and compares
the distlock rows (never the baselines) scenario by scenario.

    scripts/bench-compare.py BEFORE_BIN AFTER_BIN ROUNDS -- LOCK_BENCH_ARGS...

Each round runs BEFORE then AFTER with the same arguments, so drift in machine load hits both
alike. Per backend and scenario it prints the median over rounds of each binary's figure (p50
latency; ops/s for throughput), after/before, and the run-to-run noise: the larger of the two
binaries' max/min spread across rounds. A change is only "slower" if after/before exceeds
that noise.
"""
import json
import statistics
import subprocess
import sys
import tempfile


def run(binary, args):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, *args, "--json", f.name], check=True,
                       stdout=subprocess.DEVNULL)
        rows = json.load(open(f.name))
    out = {}
    for r in rows:
        if r["baseline"]:
            continue
        key = (r["backend"], r["scenario"])
        out[key] = r["ops_per_sec"] if r["scenario"] == "throughput" else r["p50_us"]
    return out


def main():
    sep = sys.argv.index("--")
    before_bin, after_bin, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    args = sys.argv[sep + 1:]
    samples = {"before": {}, "after": {}}
    for _ in range(rounds):
        for label, binary in (("before", before_bin), ("after", after_bin)):
            for key, value in run(binary, args).items():
                if value is not None:
                    samples[label].setdefault(key, []).append(value)
    print("| backend | scenario | figure | before (median) | after (median) | after/before | "
          "noise (max/min of one binary) | verdict |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    for key in sorted(samples["after"]):
        b, a = samples["before"].get(key), samples["after"][key]
        if not b:
            continue
        throughput = key[1] == "throughput"
        mb, ma = statistics.median(b), statistics.median(a)
        noise = max(max(b) / min(b), max(a) / min(a))
        # Slower: higher latency, or lower throughput.
        change = (mb / ma) if throughput else (ma / mb)
        verdict = "slower" if change > noise else "within noise"
        if change < 1 / noise:
            verdict = "faster"
        figure = "ops/s" if throughput else "p50 µs"
        print(f"| {key[0]} | {key[1]} | {figure} | {mb:.1f} | {ma:.1f} | "
              f"{ma / mb:.2f} | {noise:.2f} | {verdict} |")


if __name__ == "__main__":
    main()
