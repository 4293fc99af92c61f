#!/usr/bin/env bash
# The main job: a local broker, the processor, and a demo agent fleet driven through the seed
# scenarios, ending with a report. Installs what it needs (apt packages, the pinned broker and
# its local image) when missing; a second run reuses the builds.
#
# Knobs: AIRLOCK_DEMO_PORT (default 19092), AIRLOCK_BROKER_IMAGE (default airlock/tansu:0.6.0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
source "$here/env.sh"

"$here/install-deps.sh"
image="$("$root/deploy/broker/build-image.sh")"
echo "demo: building airlock"
cargo build --locked -p airlock-processor --bin airlock
airlock="$CARGO_TARGET_DIR/debug/airlock"

port="${AIRLOCK_DEMO_PORT:-19092}"
name="airlock-demo-broker-$$"
state="$(mktemp -d)"
processor_pid=""
cleanup() {
  [ -n "$processor_pid" ] && kill -TERM "$processor_pid" 2>/dev/null && wait "$processor_pid" 2>/dev/null || true
  docker rm -f "$name" >/dev/null 2>&1 || true
  rm -rf "$state"
}
trap cleanup EXIT

echo "demo: starting the broker ($image) on localhost:$port"
docker run -d --rm --name "$name" -p "$port:9092" "$image" broker \
  --storage-engine memory://tansu/ --listener-url tcp://0.0.0.0:9092 \
  --advertised-listener-url "tcp://localhost:$port" >/dev/null
for _ in $(seq 1 60); do
  docker logs "$name" 2>&1 | grep -q "ready in" && break
  sleep 1
done

export AIRLOCK_KAFKA_BROKERS="localhost:$port"
export AIRLOCK_TOPICS_PARTITIONS="${AIRLOCK_TOPICS_PARTITIONS:-3}"
export AIRLOCK_STATE_DIR="$state"
export AIRLOCK_SESSION_TIMEOUT_MS=6000
export AIRLOCK_INSTANCE=demo-processor

"$airlock" topics create
echo "demo: starting the processor (log: $state/processor.log)"
"$airlock" run >"$state/processor.log" 2>&1 &
processor_pid=$!

"$airlock" fleet --timeout-seconds 90
status=$?
echo "demo: processor log (last lines):"
tail -n 5 "$state/processor.log"
exit $status
