"""A kazoo Lock holder for the interoperability tests (distlock-cli/tests/interop.rs).

    python kazoo_hold.py <hosts> <lock-path> <release-file>

Prints "acquired" once it holds the lock, releases once <release-file> exists, then exits.
kazoo >= 2.8 counts other clients' contender nodes only with extra_lock_patterns; distlock's
(and Curator's) nodes are named <prefix>-lock-<seq>.
"""
import os
import sys
import time

from kazoo.client import KazooClient

hosts, path, release = sys.argv[1:4]
zk = KazooClient(hosts=hosts, timeout=10)
zk.start()
lock = zk.Lock(path, "kazoo", extra_lock_patterns=["-lock-"])
lock.acquire()
print("acquired", flush=True)
while not os.path.exists(release):
    time.sleep(0.02)
lock.release()
zk.stop()
print("released", flush=True)
