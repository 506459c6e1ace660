#!/usr/bin/env python3
"""Builds the test binaries once, then runs them in lanes: one lane per set of servers.

    scripts/run-tests.py TIMES [--jobs N] -- CARGO_TEST_ARGS...

The suite's time is almost all waiting (leases expiring, partitions healing, one conformance
case at a time because cases measure timings), so binaries that share no server run at once.
A lane is the set of packages whose tests start, stop, freeze or restart the same servers;
lanes run concurrently (at most `--jobs` at a time, longest first), the binaries of one lane
one after another, as `cargo test` would. Packages named in no lane (the facade and the CLI,
whose tests use every backend's servers) run after every lane has finished, alone. Doc tests
run last, through cargo.

Each binary's output goes to `target/test-logs/`; a line per binary says how it went, and a
failing binary's whole output is printed. Every binary runs even after a failure, so that one
run names every broken promise. Appends `<seconds>\\t<what>` lines to TIMES for
`scripts/test.sh`'s table. Exits non-zero if any binary or doc test failed.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# package -> lane. A lane's name is the servers it owns (scripts/services.sh names, or none).
# package, or package/test binary -> lane (None: after the lanes, alone); the lane's name
# says whose servers it uses. Lanes
# start longest first, in the order they first appear here (2026-11-28, one at a time: etcd
# conformance 9 min, ZooKeeper partitions 9, ...).
LANES = {
    "lock-etcd": "etcd",
    # Partitions and clocks: clusters and servers a test starts itself, on free ports.
    "lock-zookeeper/partition": "zookeeper-partitions",
    "lock-etcd/partition": "etcd-partitions",
    "lock-zookeeper": "zookeeper",
    # Redis and Redlock share redis-servers (a Redis replica test follows a Redlock master).
    "lock-redis": "redis",
    # Valkey has a server of its own: its conformance run is a lane beside Redis's.
    "lock-redis/valkey": "valkey",
    # The Sentinel deployment: its suite, then failovers that kill its master.
    "lock-redis/sentinel": "sentinel",
    # The Redis Cluster: its suite, then failovers that kill a shard's master.
    "lock-redis/cluster": "cluster",
    "lock-redlock": "redis",
    # The memory driver and its negative controls: no server at all.
    "conformance-tests": "controls",
    "lock-postgres": "postgres",
    # Alone (None): it must *see* the overlaps a clock step causes, and under the lanes' load
    # the workload's timing let 15 steps pass unseen once (2026-11-28; alone it sees them).
    "lock-redis/clock": None,
    "lock-redlock/clock": "own-servers",
    # Sentinel deployments of its own: passwords, TLS, Valkey (the shared one has none).
    "lock-redis/sentinel_own": "own-servers",
    "lock-redis/renewals": "own-servers",
    # Three TLS cluster nodes of its own.
    "lock-redis/cluster_tls": "own-servers",
    "lock-zookeeper/clock": "own-servers",
    "lock-core": "own-servers",
    "lock-file": "own-servers",
    "lock-bench": "own-servers",
    "table-driver": "own-servers",
    "test-support": "own-servers",
    "server-probes": "own-servers",
}

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "target" / "test-logs"
PRINT = threading.Lock()


def say(line: str) -> None:
    with PRINT:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class Binary:
    def __init__(self, message: dict):
        self.package = message["package_id"]
        self.manifest = Path(message["manifest_path"])
        self.name = message["target"]["name"]
        self.kind = message["target"]["kind"][0]
        self.path = message["executable"]
        # `path+file:///work/main/lock-etcd#0.1.0`, or `...#name@0.1.0` where the directory
        # is not the package's name.
        url, _, fragment = self.package.partition("#")
        self.pkg = fragment.split("@")[0] if "@" in fragment else url.rstrip("/").rsplit("/", 1)[-1]
        self.lane = LANES.get(f"{self.pkg}/{self.name}", LANES.get(self.pkg))

    def label(self) -> str:
        what = "unit tests" if self.kind in ("lib", "bin") else f"tests/{self.name}.rs"
        return f"{self.pkg}: {what}"

    def run(self, times, logged: bool) -> bool:
        env = dict(os.environ)
        env["CARGO_MANIFEST_DIR"] = str(self.manifest.parent)
        env["CARGO_PKG_NAME"] = self.pkg
        began = time.monotonic()
        if logged:
            LOGS.mkdir(parents=True, exist_ok=True)
            log = LOGS / f"{self.pkg}--{self.name}--{self.kind}.log"
            with open(log, "w", encoding="utf-8") as out:
                code = subprocess.call(
                    [self.path], cwd=self.manifest.parent, env=env,
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                )
        else:
            say(f"\n     Running {self.label()} ({self.path})")
            code = subprocess.call([self.path], cwd=self.manifest.parent, env=env)
        took = time.monotonic() - began
        times.write(f"{took:.1f}\t{self.label()}" + (f" [lane {self.lane}]" if self.lane else "") + "\n")
        times.flush()
        if logged:
            text = log.read_text(encoding="utf-8", errors="replace")
            summary = [l for l in text.splitlines() if l.startswith("test result:")]
            tail = summary[-1] if summary else f"exit status {code}"
            if code == 0:
                say(f"  ok   {took:7.1f} s  {self.label()}  ({tail})")
            else:
                say(f"\n==== FAILED {self.label()} (lane {self.lane}, {took:.1f} s), "
                    f"its whole output ({log}):\n{text}\n==== end of {self.label()}\n")
                DIGESTS.append((self.label(), digest(text)))
        return code == 0


# What each failed binary said about its failures, printed again at the very end: a whole
# output can run to thousands of lines, and a reader of the last screen (or of CI's excerpt)
# should see which promise broke and the evidence without scrolling back.
DIGESTS = []


def digest(text: str, most: int = 40) -> str:
    """The failure messages of a test binary's output: from libtest's first `failures:` line
    to its summary, at most `most` lines, each cut to 2,000 characters."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == "failures:"), None)
    if start is None:
        # It did not get to its summary (a crash, an exit): its last lines say why.
        part = lines[-most:]
    else:
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("test result:")),
                   len(lines))
        part = lines[start:end + 1]
    cut = [l if len(l) <= 2000 else l[:2000] + " [...]" for l in part if l.strip()]
    if len(cut) > most:
        cut = cut[:most] + [f"[... {len(cut) - most} more lines in the whole output above]"]
    return "\n".join(cut)


def build(cargo_args) -> list:
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics", *cargo_args]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    found = []
    for line in proc.stdout.splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
            found.append(Binary(m))
    return found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("times")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("cargo", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cargo_args = a.cargo[1:] if a.cargo[:1] == ["--"] else a.cargo
    times = open(a.times, "a", encoding="utf-8")

    binaries = build(cargo_args)
    lanes, alone = {}, []
    for b in binaries:
        (lanes.setdefault(b.lane, []) if b.lane else alone).append(b)
    for group in [*lanes.values(), alone]:
        group.sort(key=lambda b: (b.pkg, b.kind != "lib", b.name))
    failed = []

    # Longest lane first: the order of the table above.
    order = sorted(lanes, key=lambda l: list(LANES.values()).index(l))
    slots = threading.Semaphore(max(1, a.jobs))

    def lane(name: str) -> None:
        with slots:
            began = time.monotonic()
            for b in lanes[name]:
                if not b.run(times, logged=True):
                    failed.append(b.label())
            times.write(f"{time.monotonic() - began:.1f}\tlane {name} (all its binaries)\n")

    if order:
        say(f"==> lanes at once (at most {a.jobs}): "
            + ", ".join(f"{l} ({len(lanes[l])} binaries)" for l in order))
        began = time.monotonic()
        threads = [threading.Thread(target=lane, args=(l,)) for l in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        times.write(f"{time.monotonic() - began:.1f}\tthe lanes, wall time\n")
    if alone:
        say("==> alone, one after another (every backend's servers, or a test the lanes would disturb): "
            + ", ".join(sorted({b.pkg for b in alone})))
        for b in alone:
            if not b.run(times, logged=False):
                failed.append(b.label())

    began = time.monotonic()
    doc = subprocess.call(["cargo", "test", "--doc", *cargo_args], cwd=ROOT)
    times.write(f"{time.monotonic() - began:.1f}\tdoc tests ({' '.join(cargo_args)})\n")
    if doc != 0:
        failed.append("doc tests")
    # Also kept beside the times file, for test.sh to print once more after its last step: a
    # reader of CI's excerpt (the first and last lines) sees them there.
    with open(os.path.join(os.path.dirname(a.times) or ".", "test-digests.txt"), "a",
              encoding="utf-8") as kept:
        for label, text in DIGESTS:
            why = f"\n==> why {label} failed (its failures; the whole output is above):\n{text}"
            say(why)
            kept.write(why + "\n")
    if failed:
        say("\n==> FAILED: " + "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
