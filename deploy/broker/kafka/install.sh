#!/usr/bin/env bash
# Fetches Apache Kafka's broker jars and a logging binding from Maven Central (pom.xml beside
# this script) into $AIRLOCK_CACHE/kafka-<version>/libs, once, and prints that home directory.
# A second run finds them and prints the path at once.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
home="$cache/kafka-$version"

# The marker holds the pom's checksum: a changed pom (another version, another binding)
# fetches again.
sum="$(sha256sum "$here/pom.xml" | cut -d' ' -f1)"
if [ -f "$home/installed" ] && [ "$(cat "$home/installed")" = "$sum" ]; then
  echo "$home"
  exit 0
fi
command -v mvn >/dev/null || { echo "kafka/install: mvn not found; install Maven (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "kafka/install: java not found; install a JRE 17 or later" >&2; exit 1; }
mkdir -p "$home"
# Concurrent starts (tests run side by side) install once: the others wait here.
exec 9>"$home/.install.lock"
flock 9
if [ -f "$home/installed" ] && [ "$(cat "$home/installed")" = "$sum" ]; then
  echo "$home"
  exit 0
fi
echo "kafka/install: fetching Apache Kafka $version from Maven Central into $home (once)" >&2
rm -rf "$home/libs.partial"
log="$home/install.log"
if ! mvn -B -q -f "$here/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$home/libs.partial" >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  echo "kafka/install: mvn failed; full log in $log" >&2
  exit 1
fi
rm -rf "$home/libs"
mv "$home/libs.partial" "$home/libs"
echo "$sum" >"$home/installed"
echo "$home"
