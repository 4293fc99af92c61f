#!/usr/bin/env bash
# The main job: a local broker, the processor, the reference ledger with its connector worker,
# and a demo agent fleet driven through the seed scenarios, ending with a report. Installs what
# it needs (apt packages, the pinned broker and its local image) when missing; a second run
# reuses the builds.
#
# Knobs: AIRLOCK_DEMO_PORT (default 19092), AIRLOCK_BROKER_IMAGE (default airlock/tansu:0.6.0).
# The demo signs dispatch commands with deploy/config/demo-capability.key, a PUBLIC demo key.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
source "$here/env.sh"

"$here/install-deps.sh"
image="$("$root/deploy/broker/build-image.sh")"
echo "demo: building airlock, airlock-connector and airlock-ledger"
cargo build --locked -p airlock-processor --bin airlock -p airlock-connectors --bins
bin="$CARGO_TARGET_DIR/debug"
airlock="$bin/airlock"

port="${AIRLOCK_DEMO_PORT:-19092}"
name="airlock-demo-broker-$$"
state="$(mktemp -d)"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  done
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

# Git keeps no file modes but the executable bit; the key loader warns about a readable key.
chmod 600 deploy/config/demo-capability.key
export AIRLOCK_CAPABILITY_SIGNING_KEY_FILE=deploy/config/demo-capability.key

"$airlock" topics create
echo "demo: starting the processor (log: $state/processor.log)"
"$airlock" run >"$state/processor.log" 2>&1 &
pids+=($!)

echo "demo: starting the reference ledger (log: $state/ledger.log)"
cat >"$state/accounts.json" <<'JSON'
{"accounts": [{"tenant_id": "acme", "account_id": "acct-42", "currency": "EUR", "balance_minor": 1000000}]}
JSON
"$bin/airlock-ledger" --listen 127.0.0.1:0 --db "$state/ledger.db" --accounts "$state/accounts.json" \
  >"$state/ledger.out" 2>"$state/ledger.log" &
pids+=($!)
ledger=""
for _ in $(seq 1 100); do
  ledger="$(sed -n 's/^listening on //p' "$state/ledger.out" 2>/dev/null | head -n 1)"
  [ -n "$ledger" ] && break
  sleep 0.1
done
[ -n "$ledger" ] || { cat "$state/ledger.log" >&2; echo "demo: the ledger did not start" >&2; exit 1; }

echo "demo: starting the ledger's connector worker (log: $state/connector.log)"
AIRLOCK_CONNECTOR_BASE_URL="http://$ledger" AIRLOCK_CONNECTOR_SESSION_TIMEOUT_MS=6000 \
  "$bin/airlock-connector" --config deploy/config/connector-ledger.toml >"$state/connector.log" 2>&1 &
pids+=($!)

status=0
"$airlock" fleet --timeout-seconds 90 || status=$?
# Effects dispatched by the last scenarios need a moment to reach the ledger.
sleep 3
echo "demo: business effects on the ledger (one per dispatched operation key):"
curl -sf "http://$ledger/v1/stats" || echo "(the ledger did not answer)"
echo
echo "demo: processor log (last lines):"
tail -n 3 "$state/processor.log"
echo "demo: connector log (last lines):"
tail -n 3 "$state/connector.log"
exit $status
