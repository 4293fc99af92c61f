#!/usr/bin/env bash
# tansu 0.6.0 as a local process (memory storage), for the compatibility tests and anyone who
# wants a broker that starts in a second. The binary comes from install.sh (run when missing).
#
#   tansu.sh start DIR [--port PORT] [--watch-pid PID]
#       Starts tansu on 127.0.0.1:PORT (default 19092) with its log in DIR/broker.log and its
#       pid in DIR/pid, waits until it answers a Metadata request, prints 127.0.0.1:PORT.
#       --watch-pid: tansu is killed once that process is gone.
#   tansu.sh stop DIR            SIGTERM, SIGKILL after 10 s.
#
# Exit status 75 when the port was already taken, 1 otherwise.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=deploy/broker/probe.sh
source "$here/../probe.sh"

die() { echo "tansu.sh: $*" >&2; exit 1; }

cmd_start() {
  local dir="${1:?usage: tansu.sh start DIR [--port PORT] [--watch-pid PID]}" port=19092 watched=""
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --port) port="$2"; shift 2 ;;
      --watch-pid) watched="$2"; shift 2 ;;
      *) die "unknown option $1" ;;
    esac
  done
  if port_in_use "$port"; then
    echo "tansu.sh: port $port is taken" >&2
    exit 75
  fi
  local bin
  bin="$("$here/install.sh")"
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  nohup "$bin" broker --storage-engine memory://tansu/ \
    --listener-url "tcp://127.0.0.1:$port" --advertised-listener-url "tcp://127.0.0.1:$port" \
    >>"$dir/broker.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$dir/pid"
  # A start that fails stops what it launched.
  trap 'cmd_stop "$dir" >/dev/null 2>&1' EXIT
  [ -z "$watched" ] || watch_and_kill "$watched" "$dir/pid"
  local deadline=$((SECONDS + 30))
  while ! answers_metadata "$port"; do
    if ! alive "$pid"; then
      if grep -qi "address already in use" "$dir/broker.log"; then
        echo "tansu.sh: port $port is taken; log: $dir/broker.log" >&2
        exit 75
      fi
      tail -n 20 "$dir/broker.log" >&2
      die "tansu exited while starting; log: $dir/broker.log"
    fi
    [ "$SECONDS" -lt "$deadline" ] || die "tansu did not answer on 127.0.0.1:$port within 30 s"
    sleep 0.1
  done
  trap - EXIT
  echo "127.0.0.1:$port"
}

cmd_stop() {
  local dir="${1:?usage: tansu.sh stop DIR}" pid
  [ -f "$dir/pid" ] || return 0
  pid="$(cat "$dir/pid")"
  kill -TERM "$pid" 2>/dev/null || return 0
  local deadline=$((SECONDS + 10))
  while alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

case "${1:-}" in
  start) shift; cmd_start "$@" ;;
  stop) shift; cmd_stop "$@" ;;
  *) die "usage: tansu.sh start|stop DIR ... (see the head of this script)" ;;
esac
