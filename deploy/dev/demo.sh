#!/usr/bin/env bash
# The main job: installs what is missing (apt packages, the pinned broker and its local image),
# builds airlock, airlock-ledger and airlock-connector, starts a local broker container, and runs
# `airlock demo` against it: the processor, the reference ledger and a connector worker as child
# processes, a demo agent fleet through the seed failures, a report per scenario. Exits with the
# demo's status; the broker container is removed at the end. A second run reuses the builds.
#
# Knobs: AIRLOCK_DEMO_PORT (default 19092), AIRLOCK_BROKER_IMAGE (default airlock/tansu:0.6.0),
# AIRLOCK_TOPICS_PARTITIONS (default 3), AIRLOCK_DEMO_WAIT_SECONDS (default 120, the bound on
# each wait); every other AIRLOCK_* variable reaches `airlock demo` and its children.
# The demo signs dispatch commands with deploy/config/demo-capability.key, a PUBLIC demo key.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
source "$here/env.sh"

"$here/install-deps.sh"
image="$("$root/deploy/broker/build-image.sh")"
echo "demo: building airlock, airlock-connector and airlock-ledger"
# The whole workspace with every target, as test.sh builds it: another package or target
# selection unifies dependency features differently and compiles RocksDB's C++ a second time.
cargo build --locked --workspace --all-targets

port="${AIRLOCK_DEMO_PORT:-19092}"
name="airlock-demo-broker-$$"
cleanup() {
  docker rm -f "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT

echo "demo: starting the broker ($image) on localhost:$port"
docker run -d --rm --name "$name" -p "$port:9092" "$image" broker \
  --storage-engine memory://tansu/ --listener-url tcp://0.0.0.0:9092 \
  --advertised-listener-url "tcp://localhost:$port" >/dev/null
ready=""
for _ in $(seq 1 60); do
  if docker logs "$name" 2>&1 | grep -q "ready in"; then
    ready=yes
    break
  fi
  sleep 1
done
if [ -z "$ready" ]; then
  docker logs "$name" 2>&1 | tail -n 20 >&2
  echo "demo: the broker did not say it was ready within 60 s" >&2
  exit 1
fi

export AIRLOCK_KAFKA_BROKERS="localhost:$port"
export AIRLOCK_TOPICS_PARTITIONS="${AIRLOCK_TOPICS_PARTITIONS:-3}"
export AIRLOCK_SESSION_TIMEOUT_MS="${AIRLOCK_SESSION_TIMEOUT_MS:-6000}"
# Git keeps no file modes but the executable bit; the key loader warns about a readable key.
chmod 600 deploy/config/demo-capability.key
export AIRLOCK_CAPABILITY_SIGNING_KEY_FILE="${AIRLOCK_CAPABILITY_SIGNING_KEY_FILE:-deploy/config/demo-capability.key}"

# Not exec: the trap removes the broker container after the demo. Ctrl-C reaches the demo and
# its children (one process group); the demo stops them and reports.
"$CARGO_TARGET_DIR/debug/airlock" demo
