"""A kazoo Lock (or Election) holder for the interoperability tests (distlock-cli/tests/interop.rs).

    python kazoo_hold.py <hosts> <lock-path> <release-file> [election <identifier>]
    python kazoo_hold.py <hosts> <lock-path> - leader

Prints "acquired" once it holds the lock (leads the election), releases (resigns) once
<release-file> exists, then exits. With `leader`, prints the election's leader, the first of
its contenders, as `leader=<identifier>`, and exits.
kazoo >= 2.8 counts other clients' contender nodes only with extra_lock_patterns; distlock's
(and Curator's) nodes are named <prefix>-lock-<seq>. An Election is its Lock with the
identifier as the contender node's data: a kazoo user shares one with Curator's or distlock's
by giving that Lock the same pattern, as here.
"""
import os
import sys
import time

from kazoo.client import KazooClient

hosts, path, release = sys.argv[1:4]
mode = sys.argv[4] if len(sys.argv) > 4 else "lock"
zk = KazooClient(hosts=hosts, timeout=10)
zk.start()
if mode == "leader":
    election = zk.Election(path)
    election.lock = zk.Lock(path, extra_lock_patterns=["-lock-"])
    contenders = election.contenders()
    print("leader=" + (contenders[0] if contenders else ""), flush=True)
    zk.stop()
    sys.exit(0)
identifier = sys.argv[5] if mode == "election" else "kazoo"
lock = zk.Lock(path, identifier, extra_lock_patterns=["-lock-"])
if mode == "election":
    election = zk.Election(path, identifier)
    election.lock = lock


def lead():
    print("acquired", flush=True)
    while not os.path.exists(release):
        time.sleep(0.02)


if mode == "election":
    election.run(lead)
else:
    lock.acquire()
    lead()
    lock.release()
zk.stop()
print("released", flush=True)
