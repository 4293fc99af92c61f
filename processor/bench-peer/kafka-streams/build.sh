#!/usr/bin/env bash
# Builds the Kafka Streams peer of airlock-bench-runtime (Maven, Java 17) into
# $AIRLOCK_CACHE/streams-peer (outside the clone) and prints the runnable jar's path. Maven
# skips the work when nothing changed.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${AIRLOCK_CACHE:-$HOME/.cache/airlock}/streams-peer"
mkdir -p "$out"
if ! mvn -B -q -f "$here/pom.xml" package -Dpeer.out="$out" >"$out/build.log" 2>&1; then
  tail -n 30 "$out/build.log" >&2
  echo "streams-peer: mvn package failed; log in $out/build.log" >&2
  exit 1
fi
echo "$out/airlock-streams-peer.jar"
