#!/usr/bin/env bash
# The safety soak (RELIABILITY.md): each driver's conformance binary runs its `safety::soak`
# trial (ignored in ordinary runs) for DISTLOCK_SOAK_GRANTS grants (default 100000) under the
# seeded nemesis, in release mode, one driver after the other. Writes, per driver,
# $DISTLOCK_SOAK_DIR/<driver>.svg (the timeline) and <driver>.md (its table row) and prints
# the table. Needs the servers of `scripts/services.sh up`; never run it beside scripts/test.sh
# (both freeze and restart the same servers). Soaks of different servers may run at once (as
# RELIABILITY.md's were: three lanes), each invocation with its own drivers.
#
#   scripts/soak.sh                 every driver
#   scripts/soak.sh redis etcd      some of them (names below)
#
# DISTLOCK_SAFETY_SEED fixes the nemesis's schedule (default 20261124). DISTLOCK_SOAK_FAMILY
# picks the modes the names are taken in: mixed (default: a third each exclusive, read-write,
# semaphores), exclusive, read-write (shared 3 times in 5), permits (semaphores of 2): a soak
# of one primitive (100,000 shared grants take DISTLOCK_SOAK_GRANTS=170000 in read-write).
# DISTLOCK_SOAK_SHARERS=k puts the clients without a breakable link on shared connections, k
# to each (default 1: none shared): one client's several leases at once, its waiters of one
# name together.
set -euo pipefail
cd "$(dirname "$0")/.."

export DISTLOCK_SOAK_GRANTS=${DISTLOCK_SOAK_GRANTS:-100000}
export DISTLOCK_SAFETY_SEED=${DISTLOCK_SAFETY_SEED:-20261124}
dir=${DISTLOCK_SOAK_DIR:-target/soak}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd) # the test binaries run in their crate's directory

# name | crate | trial | label in the table | test binary (default: conformance)
runs="memory lock-core safety::soak memory
file lock-file safety::soak file
redis lock-redis safety::soak Redis
redis-aof lock-redis aof::safety::soak Redis,_AOF_always
redlock lock-redlock safety::soak Redlock_(5_masters)
zk lock-zookeeper single::safety::soak ZooKeeper,_single
zk-ensemble lock-zookeeper ensemble::safety::soak ZooKeeper,_ensemble_of_3
etcd lock-etcd single::safety::soak etcd,_single
etcd-cluster lock-etcd cluster::safety::soak etcd,_cluster_of_3
etcd-shared lock-etcd shared_lease::safety::soak etcd,_single,_shared_lease
postgres lock-postgres safety::soak PostgreSQL
postgres-shared lock-postgres shared_sessions::safety::soak PostgreSQL,_shared_sessions=2,_shared_waits,_wait_sessions=1
sentinel lock-redis failover::safety::soak Redis_Sentinel,_failovers sentinel
sentinel-wait lock-redis failover-wait::safety::soak Redis_Sentinel,_failovers,_wait_replicas=2 sentinel
cluster lock-redis failover::safety::soak Redis_Cluster,_shard_failovers cluster
cluster-wait lock-redis failover-wait::safety::soak Redis_Cluster,_shard_failovers,_wait_replicas=1 cluster"

wanted=("$@")
status=0
while read -r name crate trial label test; do
  if [ ${#wanted[@]} -gt 0 ] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then
    continue
  fi
  echo "soak: $name ($DISTLOCK_SOAK_GRANTS grants, seed $DISTLOCK_SAFETY_SEED)" >&2
  rm -f "$dir/$name.md"
  # Build with cargo, run the binary itself: cargo keeps its build lock while tests run, and
  # several soaks (of different servers) may run at once.
  bin=$(cargo test -q --release -p "$crate" --test "${test:-conformance}" --no-run --message-format=json |
    grep -o '"executable":"[^"]*"' | tail -1 | cut -d'"' -f4)
  (cd "$crate" && DISTLOCK_SOAK_OUT="$dir/$name" DISTLOCK_SOAK_LABEL="${label//_/ }" \
    "$bin" --ignored --exact "$trial") >&2 || status=1
done <<<"$runs"

echo "| driver | grants | time | blackhole | delay | cut | pause | freeze | restart | partition | bridge | one-way | clock | double | violations (a) / (b) / (c) / (d) | stale writes refused | cut-off holder → lost signal p50 / p99 | heal → next grant p50 / p99 | hand-off p50 / p99 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|---|"
while read -r name _; do
  [ -f "$dir/$name.md" ] && cat "$dir/$name.md"
done <<<"$runs"
exit $status
