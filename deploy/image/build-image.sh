#!/usr/bin/env bash
# Builds the Airlock image from binaries built here (release profile): FROM scratch with
# `airlock`, `airlock-connector`, `airlock-ledger`, the shared libraries `ldd` names, CA
# certificates and deploy/config. Prints the image name. Rebuilds the binaries incrementally
# and the image every time (it is small: tens of MB).
#
# Knobs: AIRLOCK_IMAGE (default airlock/airlock:dev), AIRLOCK_IMAGE_PROFILE (release or dev;
# default release), CARGO_TARGET_DIR (see deploy/dev/env.sh).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
image="${AIRLOCK_IMAGE:-airlock/airlock:dev}"
profile="${AIRLOCK_IMAGE_PROFILE:-release}"
# shellcheck source=../dev/env.sh
source "$root/deploy/dev/env.sh"
"$root/deploy/dev/install-deps.sh"

case "$profile" in
  release) flag=(--release); dir=release ;;
  dev) flag=(); dir=debug ;;
  *) echo "build-image: AIRLOCK_IMAGE_PROFILE must be release or dev, not $profile" >&2; exit 2 ;;
esac
echo "build-image: building the binaries ($profile)" >&2
(cd "$root" && cargo build --locked "${flag[@]}" --workspace --bins >&2)

context="$(mktemp -d)"
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/srv/airlock/deploy" "$rootfs/etc/ssl/certs" \
  "$context/state/var/lib/airlock" "$context/state/var/lib/ledger"
for bin in airlock airlock-connector airlock-ledger; do
  # Without the debug info (the release profile keeps it for benchmarks and profiling):
  # symbols stay, so backtraces still name functions.
  objcopy --strip-debug "$CARGO_TARGET_DIR/$dir/$bin" "$rootfs/usr/local/bin/$bin"
  # Every shared library the binary links, at the path the loader expects.
  ldd "$CARGO_TARGET_DIR/$dir/$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
    while read -r lib; do
      [ -f "$lib" ] || continue
      mkdir -p "$rootfs$(dirname "$lib")"
      cp -L "$lib" "$rootfs$lib"
    done
done
cp -r "$root/deploy/config" "$rootfs/srv/airlock/deploy/config"
# The public demo signing key, readable by the image's user only (mount your own in production).
rm "$rootfs/srv/airlock/deploy/config/demo-capability.key"
mkdir -p "$context/state/srv/airlock/keys"
install -m 600 "$root/deploy/config/demo-capability.key" "$context/state/srv/airlock/keys/demo-capability.key"
[ -f /etc/ssl/certs/ca-certificates.crt ] && cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/"
# The unprivileged user the image runs as owns its state directories.
printf 'root:x:0:0::/:/bin/false\nairlock:x:10001:10001::/srv/airlock:/bin/false\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nairlock:x:10001:\n' >"$rootfs/etc/group"
chmod 1777 "$rootfs/tmp"
cp "$here/Dockerfile" "$context/Dockerfile"
docker build -q -t "$image" "$context" >/dev/null 2>"$context/build.log" || {
    cat "$context/build.log" >&2
    echo "build-image: docker build failed" >&2
    exit 1
  }
echo "$image"
