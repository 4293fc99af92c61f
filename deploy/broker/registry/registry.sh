#!/usr/bin/env bash
# A Confluent-compatible schema registry as a local process: Apicurio Registry (in-memory H2
# storage) for the demo and the tests. Confluent clients take the URL that start prints, which
# ends in /apis/ccompat/v7 (subjects, versions, schemas/ids, config, compatibility). The
# application comes from install.sh (run here when missing: a Maven build, once, into the
# cache).
#
#   registry.sh start DIR [--port PORT] [--watch-pid PID] [--set KEY=VALUE]...
#       Uses DIR (absent or empty) for the pid, the port and the log (DIR/registry.log),
#       starts the registry on 127.0.0.1:PORT (default 18081), waits until its Confluent API
#       answers, prints its URL (http://127.0.0.1:PORT/apis/ccompat/v7) on stdout.
#       --watch-pid: the registry is killed once that process is gone (a test harness passes
#       its own pid). --set passes a Quarkus or Apicurio configuration property (-DKEY=VALUE),
#       e.g. --set registry.ccompat.legacy-id-mode.enabled=true.
#   registry.sh stop DIR     SIGTERM (a clean shutdown), SIGKILL after 30 s.
#
# The schemas live in the process's memory: a stopped registry forgets them.
#
# Exit status 75 when the port was already taken (pick another and try again), 1 otherwise.
#
# Knobs: AIRLOCK_CACHE (default $HOME/.cache/airlock), REGISTRY_HEAP (default 512m: the maximum
# heap), REGISTRY_JVM_OPTS (replaces the JVM flags below the heap), REGISTRY_START_SECONDS
# (default 90: the bound on a start, the install not counted).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start_seconds="${REGISTRY_START_SECONDS:-90}"
# shellcheck source=deploy/broker/probe.sh
source "$here/../probe.sh"

die() { echo "registry.sh: $*" >&2; exit 1; }

# Two cores and a shared machine: a small heap, G1 with short pauses, and the JVM gone at once
# on OutOfMemoryError rather than limping.
jvm_opts() {
  local heap="${REGISTRY_HEAP:-512m}"
  echo "-Xms64m -Xmx$heap ${REGISTRY_JVM_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError -XX:ActiveProcessorCount=2 -Djava.awt.headless=true}"
}

# The Confluent API answers (200 on the subject list): storage and REST layer are up.
answers_http() {
  local port="$1"
  [ "$(curl -s -o /dev/null -m 5 -w '%{http_code}' "http://127.0.0.1:$port/apis/ccompat/v7/subjects" 2>/dev/null)" = "200" ]
}

cmd_start() {
  local dir="" port=18081 watched="" props=()
  dir="${1:?usage: registry.sh start DIR [--port PORT] [--watch-pid PID] [--set K=V]}"
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --watch-pid) watched="$2"; shift 2 ;;
      --set) props+=("-D$2"); shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  command -v curl >/dev/null || die "curl not found (apt-get install curl)"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  [ -z "$(ls -A "$dir")" ] || die "$dir is not empty: start takes a fresh directory"
  if port_in_use "$port"; then
    echo "registry.sh: port $port is taken" >&2
    exit 75
  fi
  local home
  home="$("$here/install.sh")"
  local deadline=$((SECONDS + start_seconds))
  # A start that fails (the JVM exits, the port is taken, a timeout, a signal) stops the
  # process it launched: nothing outlives a failed start.
  trap 'cmd_stop "$dir" >/dev/null 2>&1' EXIT
  echo "$port" >"$dir/port"
  # Loopback only; a smaller connection pool than Apicurio's default of 20 to 100; the JVM
  # runs in DIR, so that anything it writes lands there.
  # shellcheck disable=SC2046
  (cd "$dir" && exec nohup java $(jvm_opts) \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dquarkus.datasource.jdbc.initial-size=2 -Dquarkus.datasource.jdbc.min-size=2 \
    -Dquarkus.datasource.jdbc.max-size=20 \
    ${props[@]+"${props[@]}"} -jar "$home/app/registry-runner.jar" \
    >>"$dir/registry.log" 2>&1 </dev/null) &
  echo $! >"$dir/pid"
  if [ -n "$watched" ]; then
    echo "$watched" >"$dir/watch-pid"
    watch_and_kill "$watched" "$dir/pid"
  fi
  local pid
  pid="$(cat "$dir/pid")"
  while ! answers_http "$port"; do
    if ! alive "$pid"; then
      if grep -q "Address already in use\|Port $port seems to be in use" "$dir/registry.log"; then
        echo "registry.sh: could not bind port $port (taken); log: $dir/registry.log" >&2
        exit 75
      fi
      tail -n 20 "$dir/registry.log" >&2
      die "the registry exited while starting; log: $dir/registry.log"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      tail -n 20 "$dir/registry.log" >&2
      die "the registry did not answer on 127.0.0.1:$port within ${start_seconds}s; log: $dir/registry.log"
    fi
    sleep 0.2
  done
  trap - EXIT
  echo "http://127.0.0.1:$port/apis/ccompat/v7"
}

cmd_stop() {
  local dir="${1:?usage: registry.sh stop DIR}" pid
  [ -f "$dir/pid" ] || return 0
  pid="$(cat "$dir/pid")"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) die "usage: registry.sh start|stop DIR ... (see the head of this script)" ;;
esac
