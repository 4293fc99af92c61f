#!/usr/bin/env bash
# Makes sure a Docker engine answers, for the container tests and images: when `docker info`
# fails, installs Debian's docker.io (if dockerd is missing) and starts dockerd in the
# background (log: $AIRLOCK_CACHE/dockerd.log), then waits up to 60 s for it. Exits 0 once an
# engine answers, 1 with dockerd's last words otherwise. Needs root to start dockerd.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock), AIRLOCK_SKIP_APT=1 (never call apt-get).
set -euo pipefail

cache="${AIRLOCK_CACHE:-$HOME/.cache/airlock}"
if docker info >/dev/null 2>&1; then
  exit 0
fi
if ! command -v dockerd >/dev/null 2>&1; then
  if [ "${AIRLOCK_SKIP_APT:-0}" = "1" ]; then
    echo "docker-engine: dockerd is missing and AIRLOCK_SKIP_APT=1; install docker.io" >&2
    exit 1
  fi
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "docker-engine: installing docker.io" >&2
  log="$(mktemp)"
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq \
      --no-install-recommends docker.io; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "docker-engine: apt-get install docker.io failed" >&2
    exit 1
  fi
  rm -f "$log"
fi
mkdir -p "$cache"
echo "docker-engine: starting dockerd (log: $cache/dockerd.log)" >&2
if [ "$(id -u)" -eq 0 ]; then
  nohup dockerd >"$cache/dockerd.log" 2>&1 </dev/null &
else
  nohup sudo dockerd >"$cache/dockerd.log" 2>&1 </dev/null &
fi
for _ in $(seq 1 120); do
  if docker info >/dev/null 2>&1; then
    exit 0
  fi
  sleep 0.5
done
tail -n 20 "$cache/dockerd.log" >&2
echo "docker-engine: dockerd did not answer within 60 s" >&2
exit 1
