#!/usr/bin/env bash
# Apache Kafka as a local process: one KRaft node (broker and controller in one JVM) or a
# cluster of three, for the demo, the tests and the benchmarks. The jars come from install.sh
# (run here when missing).
#
#   kafka.sh start DIR [--port PORT] [--nodes N] [--watch-pid PID] [--set KEY=VALUE]...
#       Lays out DIR (absent or empty), starts N nodes, waits until each answers a Metadata
#       request, prints the bootstrap list (127.0.0.1:PORT,...) on stdout. Node i (1-based)
#       listens on PORT+i-1 for clients and PORT+N+i-1 for the controller quorum; its data,
#       log (DIR/node-i/broker.log), configuration and pid live in DIR/node-i. With N = 3 the
#       replication factor is 3 and min.insync.replicas 2. --watch-pid: every node is killed
#       once that process is gone (a test harness passes its own pid, so that a killed test
#       run leaves no broker behind). --set adds or overrides a server property on every node.
#   kafka.sh stop DIR [NODE]     SIGTERM (a clean shutdown), SIGKILL after 30 s.
#   kafka.sh kill DIR NODE       SIGKILL one node, as a crash would.
#   kafka.sh restart DIR NODE    starts a stopped or killed node again on its data and waits
#                                until it answers.
#
# Exit status 75 when a port was already taken (pick another and try again), 1 otherwise.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock), KAFKA_HEAP (default 768m: the maximum
# heap of each node), KAFKA_JVM_OPTS (replaces the JVM flags below the heap),
# KAFKA_START_SECONDS (default 90: the bound on a whole start or restart).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start_seconds="${KAFKA_START_SECONDS:-90}"
# One bound for a whole start or restart, however many nodes it waits for.
deadline=$((SECONDS + start_seconds))
# shellcheck source=deploy/broker/probe.sh
source "$here/../probe.sh"

die() { echo "kafka.sh: $*" >&2; exit 1; }

# Two cores and a shared machine: a small heap, G1 with short pauses, and the JVM gone at once
# on OutOfMemoryError rather than limping.
jvm_opts() {
  local heap="${KAFKA_HEAP:-768m}"
  echo "-Xms128m -Xmx$heap ${KAFKA_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -XX:ActiveProcessorCount=2 -Djava.awt.headless=true}"
}

kafka_home() {
  "$here/install.sh"
}

# A formatted metadata directory of this Kafka version, made once (one JVM run) and copied for
# every node: each copy gets its node id and a directory id of its own.
template() {
  local home="$1" tpl="$1/format-template"
  if [ ! -f "$tpl/meta.properties" ]; then
    local tmp
    tmp="$(mktemp -d "$home/format.XXXXXX")"
    cat >"$tmp/format.properties" <<EOF
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:9093
listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093
controller.listener.names=CONTROLLER
log.dirs=$tmp/data
EOF
    local cluster
    cluster="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    # shellcheck disable=SC2046
    java $(jvm_opts) -cp "$home/libs/*" -Dlog4j2.configurationFile="$here/log4j2.yaml" \
      kafka.tools.StorageTool format -t "$cluster" -c "$tmp/format.properties" \
      >"$tmp/format.log" 2>&1 || { cat "$tmp/format.log" >&2; die "formatting the template failed"; }
    # Another run may have made it meanwhile: keep whichever landed first.
    mv -T "$tmp/data" "$tpl" 2>/dev/null || true
    rm -rf "$tmp"
  fi
  echo "$tpl"
}

node_properties() {
  local dir="$1" nodes="$2" port="$3" i="$4" extra="$5"
  local voters="" j
  for j in $(seq 1 "$nodes"); do
    voters="${voters:+$voters,}$j@127.0.0.1:$((port + nodes + j - 1))"
  done
  local rf=1 isr=1
  if [ "$nodes" -ge 3 ]; then rf=3; isr=2; fi
  cat <<EOF
process.roles=broker,controller
node.id=$i
controller.quorum.voters=$voters
listeners=PLAINTEXT://127.0.0.1:$((port + i - 1)),CONTROLLER://127.0.0.1:$((port + nodes + i - 1))
advertised.listeners=PLAINTEXT://127.0.0.1:$((port + i - 1))
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/node-$i/data
default.replication.factor=$rf
min.insync.replicas=$isr
offsets.topic.replication.factor=$rf
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=$isr
# Sized for two cores: few threads, few internal partitions (50 by default, created on the
# first group or transaction, seconds on a small machine).
num.network.threads=2
num.io.threads=2
background.threads=2
num.replica.fetchers=1
log.cleaner.threads=1
num.recovery.threads.per.data.dir=1
offsets.topic.num.partitions=5
transaction.state.log.num.partitions=5
# Local runs: a group forms at once, and tests may use short session timeouts.
group.initial.rebalance.delay.ms=0
group.min.session.timeout.ms=1000
$extra
EOF
}

launch() {
  local dir="$1" i="$2" home
  home="$(kafka_home)"
  local node="$dir/node-$i"
  # shellcheck disable=SC2046
  nohup java $(jvm_opts) -cp "$home/libs/*" -Dlog4j2.configurationFile="$here/log4j2.yaml" \
    -Dkafka.logs.dir="$node" kafka.Kafka "$node/server.properties" \
    >>"$node/broker.log" 2>&1 </dev/null &
  echo $! >"$node/pid"
}

# Waits for node i to answer, or for its JVM to die (a taken port answers 75).
await() {
  local dir="$1" i="$2" port="$3"
  local node="$dir/node-$i" pid
  pid="$(cat "$node/pid")"
  while ! answers_metadata "$port"; do
    if ! alive "$pid"; then
      if grep -q "Address already in use" "$node/broker.log"; then
        echo "kafka.sh: node $i could not bind its ports (taken); log: $node/broker.log" >&2
        exit 75
      fi
      tail -n 20 "$node/broker.log" >&2
      die "node $i exited while starting; log: $node/broker.log"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$node/broker.log" >&2
      die "node $i did not answer on 127.0.0.1:$port within ${start_seconds}s; log: $node/broker.log"
    fi
    sleep 0.2
  done
}

cmd_start() {
  local dir="" port=19092 nodes=1 watched="" extra=""
  dir="${1:?usage: kafka.sh start DIR [--port PORT] [--nodes N] [--watch-pid PID] [--set K=V]}"
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --nodes) nodes="$2"; shift 2 ;;
      --watch-pid) watched="$2"; shift 2 ;;
      --set) extra="$extra$2"$'\n'; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  [ "$nodes" -ge 1 ] || die "--nodes must be at least 1"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty: start formats a fresh directory"
  local i p
  for i in $(seq 0 $((2 * nodes - 1))); do
    p=$((port + i))
    if port_in_use "$p"; then
      echo "kafka.sh: port $p is taken" >&2
      exit 75
    fi
  done
  local home tpl
  home="$(kafka_home)"
  tpl="$(template "$home")"
  # A start that fails (a node that exits, a port taken, a timeout, a signal) stops the nodes
  # it launched: nothing outlives a failed start.
  trap 'cmd_stop "$dir" >/dev/null 2>&1' EXIT
  for i in $(seq 1 "$nodes"); do
    local node="$dir/node-$i"
    mkdir -p "$node"
    cp -r "$tpl" "$node/data"
    local dirid
    dirid="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    sed -i -e "s/^node.id=.*/node.id=$i/" -e "s/^directory.id=.*/directory.id=$dirid/" \
      "$node/data/meta.properties"
    node_properties "$dir" "$nodes" "$port" "$i" "$extra" >"$node/server.properties"
    echo "$((port + i - 1))" >"$node/port"
    launch "$dir" "$i"
  done
  if [ -n "$watched" ]; then
    echo "$watched" >"$dir/watch-pid"
    local pids=()
    for i in $(seq 1 "$nodes"); do pids+=("$dir/node-$i/pid"); done
    watch_and_kill "$watched" "${pids[@]}"
  fi
  local bootstrap=""
  for i in $(seq 1 "$nodes"); do
    await "$dir" "$i" "$((port + i - 1))"
    bootstrap="${bootstrap:+$bootstrap,}127.0.0.1:$((port + i - 1))"
  done
  trap - EXIT
  echo "$bootstrap"
}

signal_node() {
  local sig="$1" node="$2"
  [ -f "$node/pid" ] || return 0
  kill "-$sig" "$(cat "$node/pid")" 2>/dev/null || true
}

cmd_stop() {
  local dir="${1:?usage: kafka.sh stop DIR [NODE]}" only="${2:-}" node pid
  for node in "$dir"/node-*; do
    [ -d "$node" ] || continue
    [ -z "$only" ] || [ "$node" = "$dir/node-$only" ] || continue
    signal_node TERM "$node"
  done
  local deadline=$((SECONDS + 30))
  for node in "$dir"/node-*; do
    [ -f "$node/pid" ] || continue
    [ -z "$only" ] || [ "$node" = "$dir/node-$only" ] || continue
    pid="$(cat "$node/pid")"
    while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    signal_node KILL "$node"
  done
}

cmd_kill() {
  local dir="${1:?usage: kafka.sh kill DIR NODE}" i="${2:?usage: kafka.sh kill DIR NODE}"
  [ -d "$dir/node-$i" ] || die "no node $i in $dir"
  signal_node KILL "$dir/node-$i"
  local pid deadline=$((SECONDS + 30))
  pid="$(cat "$dir/node-$i/pid")"
  while alive "$pid"; do
    [ "$SECONDS" -lt "$deadline" ] || die "node $i (pid $pid) did not die within 30 s"
    sleep 0.1
  done
}

cmd_restart() {
  local dir="${1:?usage: kafka.sh restart DIR NODE}" i="${2:?usage: kafka.sh restart DIR NODE}"
  local node="$dir/node-$i"
  [ -f "$node/server.properties" ] || die "no node $i in $dir"
  if [ -f "$node/pid" ] && alive "$(cat "$node/pid")"; then
    die "node $i is still running (pid $(cat "$node/pid"))"
  fi
  launch "$dir" "$i"
  # The new process is watched like the first (see start's --watch-pid).
  if [ -f "$dir/watch-pid" ]; then
    watch_and_kill "$(cat "$dir/watch-pid")" "$node/pid"
  fi
  await "$dir" "$i" "$(cat "$node/port")"
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  kill) shift; cmd_kill "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  *) die "usage: kafka.sh start|stop|kill|restart DIR ... (see the head of this script)" ;;
esac
