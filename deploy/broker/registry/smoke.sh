#!/usr/bin/env bash
# Checks a running registry through its Confluent-compatible API, as a Confluent client would
# use it: BACKWARD compatibility on a subject, ToolProposal registered and read back by id, an
# incompatible change refused (409), a compatible one (an optional field with a default)
# accepted as version 2. Exits non-zero on the first check that fails.
#
#   smoke.sh URL [SUBJECT]     URL as registry.sh start prints it (…/apis/ccompat/v7)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
url="${1:?usage: smoke.sh URL [SUBJECT]}"
subject="${2:-airlock-smoke-$$-value}"
avsc="$here/../../../schemas/avro/ToolProposal.avsc"
ct='Content-Type: application/vnd.schemaregistry.v1+json'
command -v jq >/dev/null || { echo "smoke.sh: jq not found" >&2; exit 1; }

fail() { echo "smoke.sh: FAIL: $*" >&2; exit 1; }
# call METHOD PATH [BODY]: prints "STATUS BODY".
call() {
  local out
  out="$(curl -s -X "$1" -H "$ct" ${3:+--data-binary "$3"} -w '\n%{http_code}' "$url$2")"
  echo "$(tail -n 1 <<<"$out") $(sed '$d' <<<"$out")"
}

r="$(call PUT "/config/$subject" '{"compatibility":"BACKWARD"}')"
[ "${r%% *}" = 200 ] || fail "PUT config: $r"
echo "config BACKWARD: $r"

v1="$(jq -c '{schema: tojson}' "$avsc")"
r="$(call POST "/subjects/$subject/versions" "$v1")"
[ "${r%% *}" = 200 ] || fail "register v1: $r"
id="$(jq -r .id <<<"${r#* }")"
echo "registered v1: $r"

r="$(call GET "/schemas/ids/$id")"
[ "${r%% *}" = 200 ] || fail "GET schemas/ids/$id: $r"
[ "$(jq -c '.schema | fromjson | .name' <<<"${r#* }")" = '"ToolProposal"' ] || fail "schema $id is not ToolProposal: $r"
echo "read back id $id: ToolProposal"

bad="$(jq -c '.fields += [{"name":"smoke_required","type":"string"}] | {schema: tojson}' "$avsc")"
r="$(call POST "/subjects/$subject/versions" "$bad")"
[ "${r%% *}" = 409 ] || fail "an incompatible change was not refused with 409: $r"
echo "incompatible change refused: ${r:0:160}"

good="$(jq -c '.fields += [{"name":"smoke_optional","type":["null","string"],"default":null}] | {schema: tojson}' "$avsc")"
r="$(call POST "/subjects/$subject/versions" "$good")"
[ "${r%% *}" = 200 ] || fail "a compatible change was refused: $r"
echo "compatible change accepted: $r"

r="$(call GET "/subjects/$subject/versions")"
[ "${r#* }" = "[1,2]" ] || fail "versions are not [1,2]: $r"
echo "versions: ${r#* }"
echo "smoke.sh: all checks passed"
