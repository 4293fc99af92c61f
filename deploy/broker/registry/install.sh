#!/usr/bin/env bash
# Builds Apicurio Registry (pom.xml beside this script: Apicurio's jars from Maven Central,
# augmented by the Quarkus Maven plugin) into $AIRLOCK_CACHE/registry/apicurio-<version>, once,
# and prints that home directory: home/app/ holds the runnable application (quarkus-run
# style: a runner jar and its lib/). A second run finds it and prints the path at once.
#
# The build runs in a copy of this folder inside the cache, so that nothing is written into
# the clone.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock); MAVEN_OPTS as for any Maven run (e.g.
# -Dmaven.repo.local=DIR).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
version="$(sed -n 's:.*<apicurio.version>\(.*\)</apicurio.version>.*:\1:p' "$here/pom.xml")"
home="$cache/registry/apicurio-$version"

# The marker holds the checksum of what the build reads: a changed pom or configuration builds
# again.
sum="$(cat "$here/pom.xml" "$here/src/main/resources/application.properties" | sha256sum | cut -d' ' -f1)"
if [ -f "$home/installed" ] && [ "$(cat "$home/installed")" = "$sum" ]; then
  echo "$home"
  exit 0
fi
command -v mvn >/dev/null || { echo "registry/install: mvn not found; install Maven (apt-get install maven)" >&2; exit 1; }
command -v java >/dev/null || { echo "registry/install: java not found; install a JRE 17 or later" >&2; exit 1; }
mkdir -p "$home"
# Concurrent starts (tests run side by side) install once: the others wait here.
exec 9>"$home/.install.lock"
flock 9
if [ -f "$home/installed" ] && [ "$(cat "$home/installed")" = "$sum" ]; then
  echo "$home"
  exit 0
fi
echo "registry/install: building Apicurio Registry $version from Maven Central into $home (once)" >&2
build="$home/build"
rm -rf "$build" "$home/app.partial"
mkdir -p "$build"
cp -r "$here/pom.xml" "$here/src" "$build/"
log="$home/install.log"
if ! mvn -B -f "$build/pom.xml" package -DskipTests >"$log" 2>&1; then
  grep -E '^\[(ERROR|WARNING)\]' "$log" | tail -n 30 >&2
  echo "registry/install: mvn failed; full log in $log" >&2
  exit 1
fi
runner="$(find "$build/target" -maxdepth 1 -name '*-runner.jar' | head -n 1)"
[ -n "$runner" ] && [ -d "$build/target/lib" ] || {
  echo "registry/install: the build made no runner jar and lib/ in $build/target; log: $log" >&2
  exit 1
}
mkdir -p "$home/app.partial"
mv "$runner" "$home/app.partial/registry-runner.jar"
mv "$build/target/lib" "$home/app.partial/lib"
rm -rf "$home/app" "$build"
mv "$home/app.partial" "$home/app"
echo "$sum" >"$home/installed"
echo "$home"
