#!/usr/bin/env bash
# Builds the local image airlock/tansu:0.6.0 (FROM scratch with the static binary install.sh
# fetches), once: skipped when the image exists. Prints the image name. Needs a Docker engine.
#
# Knobs: AIRLOCK_TANSU_IMAGE (default airlock/tansu:0.6.0).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${AIRLOCK_TANSU_IMAGE:-airlock/tansu:0.6.0}"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
bin="$("$here/install.sh")"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
cp "$bin" "$context/tansu"
cp "$here/Dockerfile" "$context/Dockerfile"
echo "tansu/build-image: building $image" >&2
docker build -q -t "$image" "$context" >&2
echo "$image"
