"""A redis-py Lock holder for the interoperability tests (distlock-cli/tests/interop.rs).

    python redis_hold.py <host:port> <key> <release-file>

Prints "acquired" once it holds the lock (the key <key>, valued with its own token, as the
redis.io single-instance recipe has it), releases once <release-file> exists, then exits.
"""
import os
import sys
import time

import redis

server, key, release = sys.argv[1:4]
host, port = server.rsplit(":", 1)
r = redis.Redis(host=host, port=int(port))
# A 30 s timeout outlasts every hold in the tests; redis-py polls every 0.1 s while it waits.
lock = r.lock(key, timeout=30, sleep=0.1)
lock.acquire(blocking=True, blocking_timeout=60)
print("acquired", flush=True)
while not os.path.exists(release):
    time.sleep(0.02)
lock.release()
print("released", flush=True)
