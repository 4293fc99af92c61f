#!/usr/bin/env bash
# Brings the compose stack up (deploy/compose/compose.yaml) and checks it end to end: the
# processor and the worker report ready, a small refund is proposed from the command line and
# lands once on the ledger, a large one waits for approval and lands after `airlock approve`,
# and `airlock replay` verifies the journal. Leaves the stack running; --down removes it
# (volumes included) at the end.
#
# Needs the images: deploy/broker/kafka/build-image.sh && deploy/image/build-image.sh.
# Knobs: AIRLOCK_COMPOSE_PROJECT (default airlock), and those of compose.yaml.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
compose=(docker-compose -f "$here/compose.yaml" -p "${AIRLOCK_COMPOSE_PROJECT:-airlock}")
metrics="127.0.0.1:${AIRLOCK_METRICS_PORT:-9464}"
worker="127.0.0.1:${AIRLOCK_CONNECTOR_METRICS_PORT:-9465}"
ledger="127.0.0.1:${AIRLOCK_LEDGER_PORT:-8088}"
down=0
[ "${1:-}" = "--down" ] && down=1

fail() {
  echo "smoke: $*" >&2
  "${compose[@]}" logs --tail 40 >&2 || true
  exit 1
}
# wait_for <what> <seconds> <command...>
wait_for() {
  local what="$1" seconds="$2"
  shift 2
  for _ in $(seq "$seconds"); do
    if "$@" >/dev/null 2>&1; then
      echo "smoke: $what"
      return 0
    fi
    sleep 1
  done
  fail "$what: not within ${seconds}s"
}
airlock() {
  "${compose[@]}" run --rm --no-deps -T processor "$@" --config deploy/config/airlock.toml
}
effects_of() {
  # by_reference: {"<reference>": <effects>}
  curl -fsS "http://$ledger/v1/stats" | grep -o "\"$1\":[0-9][0-9]*" | head -n 1 | sed 's/.*://'
}
committed_once() {
  test "$(effects_of "$1")" = 1
}

"${compose[@]}" up -d
wait_for "processor ready (every partition restored and claimed)" 180 curl -fsS "http://$metrics/readyz"
wait_for "connector worker ready" 120 curl -fsS "http://$worker/readyz"
wait_for "ledger up" 60 curl -fsS "http://$ledger/healthz"

run="smoke-$(date +%s)"
money() { printf '{"tenant_id":"acme","account_id":"acct-42","amount":{"minor_units":%s,"currency":"EUR"}}' "$1"; }
propose() {
  airlock propose --tool refund --operation-key "$1" --arguments "$(money "$2")" --tenant acme \
    --principal agent-support-1 --run-id "$run"
}

small="refund:$run-small"
answer="$(propose "$small" 2500)"
echo "$answer"
echo "$answer" | grep -q "ACCEPTED AUTO_APPROVED" || fail "the small refund was not accepted"
wait_for "the small refund committed once on the ledger" 60 committed_once "$small"

large="refund:$run-large"
answer="$(propose "$large" 20000)"
echo "$answer"
echo "$answer" | grep -q PENDING_APPROVAL || fail "the large refund does not wait for approval"
hash="$(echo "$answer" | sed -n 's/^arguments_hash: //p')"
airlock approve "$large" --arguments-hash "$hash" --approver alice --tenant acme \
  --comment "smoke test" || fail "the approval was refused"
wait_for "the approved refund committed once on the ledger" 60 committed_once "$large"

airlock replay || fail "the journal does not verify"
curl -fsS "http://$metrics/metrics" | grep -E '^airlock_decisions_total' | head -5
echo "smoke: ok"
if [ "$down" = 1 ]; then
  "${compose[@]}" down -v
fi
