#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing (idempotently), then rustfmt,
# clippy with warnings denied, rustdoc with warnings denied (broken or ambiguous intra-doc
# links), the Python and TypeScript clients' contract tests, and every test of the workspace
# (among them the Python client, its MCP gateway and adapters, and the TypeScript client
# against a live Airlock: tests/python_client.rs, tests/typescript_client.rs; the Python client
# against a schema registry too: tests/schema_registry.rs), then a minute of
# fuzzing per fuzz target (fuzz/).
#
# Knobs (environment):
#   CARGO_TARGET_DIR   build outputs; default $HOME/.cache/airlock/target (outside the clone, so
#                      a fresh clone reuses earlier builds)
#   AIRLOCK_CACHE      the brokers' jars and binaries, the schema registry, the Python
#                      environment; default
#                      $HOME/.cache/airlock
#   AIRLOCK_SKIP_APT=1 never call apt-get (you installed the packages yourself)
#   AIRLOCK_TEST_BROKER  the integration tests' broker: kafka (default: Apache Kafka 4.4 started
#                      per test as a process), tansu, external (with AIRLOCK_TEST_BROKERS) or
#                      container (with AIRLOCK_BROKER_IMAGE); tests/README.md has the details
#   AIRLOCK_SKIP_CONTAINERS=1  skip the container test (and starting a Docker engine for it)
#   CI=true            builds without incremental compilation (a clone is built once)
#   AIRLOCK_FUZZ_SECONDS  how long each fuzz target runs (default 60); AIRLOCK_SKIP_FUZZ=1
#                      leaves fuzzing out (deploy/dev/fuzz.sh)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

"$here/install-deps.sh"
# Node.js is not installed here (Debian 12 ships 18): say so before building anything.
if ! command -v npm >/dev/null 2>&1 \
  || [ "$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -lt 20 ]; then
  echo "test.sh: the TypeScript client's tests need Node.js 20 or later with npm" \
    "(found: $(node --version 2>/dev/null || echo none)); install it from nodejs.org or" \
    "NodeSource" >&2
  exit 1
fi
# shellcheck source=deploy/dev/env.sh
source "$here/env.sh"

step() { printf '\n==> %s\n' "$*"; }

# A CI clone is built once: incremental compilation would only add gigabytes to the cache.
if [ "${CI:-}" = "true" ]; then
  export CARGO_INCREMENTAL=0
fi
# The shared build cache keeps a set of test binaries per clone path and per configuration;
# those nobody rebuilt for three days (and stale incremental sessions) are deleted, so that the
# cache does not grow without bound. Cargo rebuilds any of them it needs again.
for dir in "$CARGO_TARGET_DIR/debug" "$AIRLOCK_CACHE/fuzz-target/x86_64-unknown-linux-gnu/release"; do
  if [ -d "$dir/deps" ]; then
    find "$dir/deps" -maxdepth 1 -type f -perm -u+x ! -name '*.*' -mtime +3 -delete
  fi
  if [ -d "$dir/incremental" ]; then
    find "$dir/incremental" -mindepth 1 -maxdepth 1 -mtime +3 -exec rm -rf {} +
  fi
done

step "brokers (fetched once into the cache)"
"$root/deploy/broker/kafka/install.sh" >/dev/null
# The schema registry of tests/tests/schema_registry.rs (Apicurio, a Maven build of about 40 s
# on a fresh machine, nothing after): installed here so that the tests only start it.
"$root/deploy/broker/registry/install.sh" >/dev/null
if [ "${AIRLOCK_TEST_BROKER:-kafka}" = "tansu" ]; then
  "$root/deploy/broker/tansu/install.sh" >/dev/null
fi

# The Python client's environment and the TypeScript client's package are prepared in the
# background while Rust builds (on a fresh machine their downloads take a minute).
python_out="$(mktemp)"
python_err="$(mktemp)"
"$here/python.sh" >"$python_out" 2>"$python_err" &
python_pid=$!
typescript_out="$(mktemp)"
typescript_err="$(mktemp)"
"$here/typescript.sh" >"$typescript_out" 2>"$typescript_err" &
typescript_pid=$!

step "cargo fmt --check"
cargo fmt --all -- --check
cargo fmt --manifest-path fuzz/Cargo.toml -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc --no-deps (warnings denied)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" cargo doc --workspace --no-deps --locked

step "the Python client: its environment, and its contract tests against the shared vectors"
if ! wait "$python_pid"; then
  cat "$python_err" >&2
  echo "test.sh: preparing the Python environment failed (deploy/dev/python.sh)" >&2
  exit 1
fi
AIRLOCK_PYTHON="$(cat "$python_out")"
export AIRLOCK_PYTHON
rm -f "$python_out" "$python_err"
"$AIRLOCK_PYTHON" -m pytest -q -p no:cacheprovider "$root/clients/python/tests" \
  --ignore="$root/clients/python/tests/integration" --ignore="$root/clients/python/tests/forged" \
  --ignore="$root/clients/python/tests/registry" --ignore="$root/clients/python/tests/tenants"

step "the TypeScript client: its package, and its contract tests against the shared vectors"
if ! wait "$typescript_pid"; then
  cat "$typescript_err" >&2
  echo "test.sh: preparing the TypeScript client failed (deploy/dev/typescript.sh)" >&2
  exit 1
fi
typescript_pkg="$(cat "$typescript_out")"
rm -f "$typescript_out" "$typescript_err"
(cd "$typescript_pkg" && node --test dist/test/contract.test.js dist/test/readme.test.js)

step "cargo test"
# Every test binary runs even after a failure, so that one run reports every failure.
cargo test --workspace --locked --no-fail-fast

if [ "${AIRLOCK_SKIP_FUZZ:-0}" != "1" ]; then
  step "fuzzing: each target for ${AIRLOCK_FUZZ_SECONDS:-60} s, two at a time (deploy/dev/fuzz.sh)"
  "$here/fuzz.sh" --seconds "${AIRLOCK_FUZZ_SECONDS:-60}"
fi

if [ "${AIRLOCK_SKIP_CONTAINERS:-0}" != "1" ]; then
  step "the container path: Apache Kafka in a container (testcontainers)"
  "$root/deploy/dev/docker-engine.sh"
  image="$("$root/deploy/broker/kafka/build-image.sh")"
  AIRLOCK_CONTAINER_IMAGE="$image" cargo test --locked -p airlock-tests --test container -- --ignored
fi
