#!/usr/bin/env bash
# Builds the local image airlock/kafka:4.4.0 (Dockerfile beside this script), once: skipped
# when the image exists. Prints the image name. Needs a Docker engine and root (debootstrap).
# The root filesystem (Debian bookworm, minbase, openjdk-17-jre-headless; about a minute to
# make) is cached in $AIRLOCK_CACHE/kafka-rootfs.
#
# Knobs: AIRLOCK_SKIP_APT=1 (never call apt-get), AIRLOCK_CACHE (default $HOME/.cache/airlock), AIRLOCK_KAFKA_IMAGE (default
# airlock/kafka:4.4.0), AIRLOCK_DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
image="${AIRLOCK_KAFKA_IMAGE:-airlock/kafka:4.4.0}"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
home="$("$here/install.sh")"
rootfs="$cache/kafka-rootfs"
if [ ! -x "$rootfs/usr/bin/java" ]; then
  if ! command -v debootstrap >/dev/null; then
    if [ "${AIRLOCK_SKIP_APT:-0}" = "1" ]; then
      echo "kafka/build-image: debootstrap is missing and AIRLOCK_SKIP_APT=1; install it" >&2
      exit 1
    fi
    echo "kafka/build-image: installing debootstrap" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends debootstrap; } >"$cache/debootstrap-install.log" 2>&1 \
      || { cat "$cache/debootstrap-install.log" >&2; exit 1; }
  fi
  echo "kafka/build-image: making a Debian root filesystem with a JRE in $rootfs (once)" >&2
  rm -rf "$rootfs.partial"
  if ! debootstrap --variant=minbase --include=openjdk-17-jre-headless bookworm \
      "$rootfs.partial" "${AIRLOCK_DEBIAN_MIRROR:-http://deb.debian.org/debian}" \
      >"$cache/kafka-rootfs.log" 2>&1; then
    tail -n 20 "$cache/kafka-rootfs.log" >&2
    echo "kafka/build-image: debootstrap failed; log in $cache/kafka-rootfs.log" >&2
    exit 1
  fi
  rm -rf "$rootfs.partial/var/cache/apt/archives"/*.deb "$rootfs.partial/var/lib/apt/lists"/*
  rm -rf "$rootfs"
  mv "$rootfs.partial" "$rootfs"
fi
# The context lives in the cache, beside the root filesystem: hard links, no 500 MB copy.
context="$(mktemp -d "$cache/image-context.XXXXXX")"
trap 'rm -rf "$context"' EXIT
cp -al "$rootfs" "$context/rootfs"
cp -al "$home/libs" "$context/libs"
cp "$here/Dockerfile" "$here/log4j2.yaml" "$here/container-start.sh" "$context/"
echo "kafka/build-image: building $image" >&2
docker build -q -t "$image" "$context" >&2
echo "$image"
