#!/usr/bin/env bash
# The main job: installs what is missing (apt packages, Apache Kafka's jars), builds airlock,
# airlock-ledger and airlock-connector, starts a local Kafka node (KRaft, as a process: no
# container engine needed), and runs `airlock demo` against it: the processor, the reference
# ledger and a connector worker as child processes, a demo agent fleet through the seed
# failures, a report per scenario. Exits with the demo's status; the broker is stopped and its
# data removed at the end. A second run reuses the builds and the jars.
#
# Knobs: AIRLOCK_DEMO_PORT (default 19092; the node's controller takes the port after it),
# AIRLOCK_DEMO_BROKERS (host:port of a broker you run yourself; nothing is started),
# AIRLOCK_TOPICS_PARTITIONS (default 3), AIRLOCK_DEMO_WAIT_SECONDS (default 120, the bound on
# each wait); every other AIRLOCK_* variable reaches `airlock demo` and its children.
# The demo signs dispatch commands with deploy/config/demo-capability.key, a PUBLIC demo key.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
"$here/install-deps.sh"
source "$here/env.sh"
echo "demo: building airlock, airlock-connector and airlock-ledger"
# The whole workspace with every target, as test.sh builds it: another package or target
# selection unifies dependency features differently and compiles RocksDB's C++ a second time.
cargo build --locked --workspace --all-targets

if [ -n "${AIRLOCK_DEMO_BROKERS:-}" ]; then
  brokers="$AIRLOCK_DEMO_BROKERS"
else
  port="${AIRLOCK_DEMO_PORT:-19092}"
  data="$(mktemp -d "${TMPDIR:-/tmp}/airlock-demo-kafka.XXXXXX")"
  cleanup() {
    "$root/deploy/broker/kafka/kafka.sh" stop "$data" >/dev/null 2>&1 || true
    rm -rf "$data"
  }
  trap cleanup EXIT
  echo "demo: starting Apache Kafka on 127.0.0.1:$port (log: $data/node-1/broker.log)"
  brokers="$("$root/deploy/broker/kafka/kafka.sh" start "$data" --port "$port" --watch-pid $$)"
fi

export AIRLOCK_KAFKA_BROKERS="$brokers"
export AIRLOCK_TOPICS_PARTITIONS="${AIRLOCK_TOPICS_PARTITIONS:-3}"
export AIRLOCK_SESSION_TIMEOUT_MS="${AIRLOCK_SESSION_TIMEOUT_MS:-6000}"
# Git keeps no file modes but the executable bit; the key loader warns about a readable key.
chmod 600 deploy/config/demo-capability.key
export AIRLOCK_CAPABILITY_SIGNING_KEY_FILE="${AIRLOCK_CAPABILITY_SIGNING_KEY_FILE:-deploy/config/demo-capability.key}"

# Not exec: the trap stops the broker after the demo. Ctrl-C reaches the demo and
# its children (one process group); the demo stops them and reports.
"$CARGO_TARGET_DIR/debug/airlock" demo
