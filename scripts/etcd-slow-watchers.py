#!/usr/bin/env python3
"""Samples an etcd member's watcher gauges while something else runs: how often a watcher sat
in etcd's *unsynced* group (`etcd_debugging_mvcc_slow_watcher_total` > 0). etcd 3.4 serves
that group from a loop that runs every 100 ms, so a watcher created with a start revision
at or before the store's current one hears of a deletion up to 100 ms late: a hand-off tail.

    scripts/etcd-slow-watchers.py SECONDS [METRICS_URL]   # default http://127.0.0.1:12379/metrics

Prints the samples taken, those with a slow watcher, and the largest counts seen.
"""
import sys
import time
import urllib.request


def main() -> int:
    seconds = float(sys.argv[1])
    url = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:12379/metrics"
    end = time.time() + seconds
    samples = slow_samples = 0
    most_slow = most_watchers = 0.0
    while time.time() < end:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("etcd_debugging_mvcc_slow_watcher_total "):
                v = float(line.split()[1])
                most_slow = max(most_slow, v)
                slow_samples += v > 0
            elif line.startswith("etcd_debugging_mvcc_watcher_total "):
                most_watchers = max(most_watchers, float(line.split()[1]))
        samples += 1
        time.sleep(0.002)
    print(f"samples {samples}, with a slow (unsynced) watcher {slow_samples} "
          f"({100.0 * slow_samples / max(samples, 1):.1f} %), most slow watchers at once "
          f"{most_slow:.0f}, most watchers at once {most_watchers:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
