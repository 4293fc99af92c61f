#!/usr/bin/env bash
# Installs the dev and CI broker, tansu (Kafka-protocol compatible, Apache-2.0), pinned, into
# $AIRLOCK_CACHE/tansu/bin, and prints the binary's path. Skips the build when the binary is
# already there: building it takes 20-30 minutes on two cores.
#
#   memory:// storage needs the `dynostore` feature, durable sqlite:// storage needs `libsql`.
#   Later releases (renamed nisshi) need a newer rustc than the pinned toolchain.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock), TANSU_VERSION (default 0.6.0).
set -euo pipefail

cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
version="${TANSU_VERSION:-0.6.0}"
root="$cache/tansu"
bin="$root/bin/tansu"

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "$version"; then
  echo "$bin"
  exit 0
fi
echo "install-tansu: building tansu $version (20-30 minutes, once); log in $cache/tansu-install.log" >&2
mkdir -p "$cache"
# The build's own target dir stays in the cache so an interrupted build resumes.
if ! cargo install tansu --version "$version" --locked --features dynostore,libsql \
    --root "$root" --target-dir "$cache/tansu-target" >"$cache/tansu-install.log" 2>&1; then
  tail -n 30 "$cache/tansu-install.log" >&2
  echo "install-tansu: cargo install failed; full log in $cache/tansu-install.log" >&2
  exit 1
fi
echo "$bin"
