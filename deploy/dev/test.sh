#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what is missing (idempotently), then
# rustfmt, clippy with warnings denied, rustdoc with warnings denied (broken or ambiguous
# intra-doc links), and every test of the workspace.
#
# Knobs (environment):
#   CARGO_TARGET_DIR   build outputs; default $HOME/.cache/airlock/target (outside the clone, so
#                      a fresh clone reuses earlier builds)
#   AIRLOCK_SKIP_APT=1 never call apt-get (you installed the packages yourself)
#   AIRLOCK_BROKER_IMAGE  broker image of the integration tests; default: the local tansu image,
#                      built (once, cached) by deploy/broker/build-image.sh. Set it to use
#                      another Kafka-protocol image (for example apache/kafka:<tag>).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

# shellcheck source=deploy/dev/env.sh
source "$here/env.sh"
"$here/install-deps.sh"

step() { printf '\n==> %s\n' "$*"; }

if [ -z "${AIRLOCK_BROKER_IMAGE:-}" ]; then
  step "broker image (the first build of tansu takes 20-30 minutes, then it is cached)"
  AIRLOCK_BROKER_IMAGE="$("$root/deploy/broker/build-image.sh")"
  export AIRLOCK_BROKER_IMAGE
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo doc --no-deps (warnings denied)"
RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" cargo doc --workspace --no-deps --locked

step "cargo test"
cargo test --workspace --locked
