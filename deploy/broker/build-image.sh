#!/usr/bin/env bash
# Builds the local broker image from the tansu binary built here: FROM scratch with the binary
# and the few glibc libraries `ldd` names (no registry can be reached, so nothing is pulled).
# Skips the build when the image exists. Prints the image name.
#
# Knobs: AIRLOCK_BROKER_IMAGE (default airlock/tansu:0.6.0). A user with a registry can point
# the tests at another Kafka-protocol image (for example apache/kafka) with the same variable.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
image="${AIRLOCK_BROKER_IMAGE:-airlock/tansu:0.6.0}"

if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
bin="$("$here/install-tansu.sh")"
context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT

mkdir -p "$context/rootfs/usr/local/bin" "$context/rootfs/tmp" "$context/rootfs/var/lib/tansu"
cp "$bin" "$context/rootfs/usr/local/bin/tansu"
# Copy every shared library the binary links, at the path the loader expects.
ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | while read -r lib; do
  [ -f "$lib" ] || continue
  mkdir -p "$context/rootfs$(dirname "$lib")"
  cp -L "$lib" "$context/rootfs$lib"
done
cp "$here/Dockerfile.tansu" "$context/Dockerfile"
echo "build-image: building $image from $bin" >&2
docker build -q -t "$image" "$context" >&2
echo "$image"
