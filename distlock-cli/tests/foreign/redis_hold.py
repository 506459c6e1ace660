"""A redis-py Lock holder for the interoperability tests (distlock-cli/tests/interop.rs).

    python redis_hold.py <host:port> <key> <release-file>
    python redis_hold.py sentinel:<host:port>,<host:port>,.../<master> <key> <release-file>
    python redis_hold.py cluster:<host:port>,<host:port>,... <key> <release-file>

Prints "acquired" once it holds the lock (the key <key>, valued with its own token, as the
redis.io single-instance recipe has it), releases once <release-file> exists, then exits.
"""
import os
import sys
import time

import redis

server, key, release = sys.argv[1:4]
if server.startswith("sentinel:"):
    # The master the sentinels name, as redis-py's Sentinel finds and follows it.
    from redis.sentinel import Sentinel

    hosts, master = server[len("sentinel:"):].split("/")
    sentinels = [(h, int(p)) for h, p in (x.rsplit(":", 1) for x in hosts.split(","))]
    r = Sentinel(sentinels, socket_timeout=2).master_for(master, socket_timeout=2)
elif server.startswith("cluster:"):
    # A Redis Cluster, found from these nodes: the key goes to its slot's master.
    from redis.cluster import ClusterNode, RedisCluster

    nodes = [ClusterNode(h, int(p)) for h, p in (x.rsplit(":", 1) for x in server[len("cluster:"):].split(","))]
    r = RedisCluster(startup_nodes=nodes, socket_timeout=2)
else:
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
