# Shared by kafka/kafka.sh and tansu/tansu.sh (sourced, not executed): what "the broker is up"
# means, and cleanup after a caller that went away.

# True when something already listens on 127.0.0.1:$1.
port_in_use() {
  (exec 2>/dev/null; exec 3<>"/dev/tcp/127.0.0.1/$1")
}

# Sends a Metadata v4 request (all topics) to 127.0.0.1:$1 and checks that the answer carries
# its correlation id and at least one broker: the node serves clients, not just accepts
# connections. Pure bash (/dev/tcp), so that no Kafka client is needed to start a broker.
answers_metadata() {
  local port="$1" reply
  reply="$(
    exec 2>/dev/null
    exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
    # size 15 | api_key 3 | version 4 | correlation 7 | client_id "" | topics null | no auto-create
    printf '\x00\x00\x00\x0f\x00\x03\x00\x04\x00\x00\x00\x07\x00\x00\xff\xff\xff\xff\x00' >&3
    timeout 5 head -c 16 <&3 | od -An -v -tx1 | tr -d ' \n'
  )" || return 1
  # size(4) correlation(4) throttle(4) broker count(4)
  [ "${#reply}" -eq 32 ] && [ "${reply:8:8}" = "00000007" ] && [ "${reply:24:8}" != "00000000" ]
}

# True while process $1 runs (a zombie, killed and not yet reaped by init, counts as gone).
alive() {
  local state
  state="$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null)" || return 1
  [ -n "$state" ] && [ "$state" != "Z" ] && [ "$state" != "X" ]
}

# Kills (SIGKILL) the processes named by the pid files $2... once process $1 is gone, or stops
# watching once none of those files exists any more (the caller stopped them itself). Detached
# from the caller's stdio, so that a caller reading our stdout to its end is not held by it.
watch_and_kill() {
  local watched="$1"
  shift
  # The pids are read once the files exist and kept, so that a caller that removes the files
  # (its temporary directory) before its brokers are gone does not leave them running.
  nohup bash -c '
    watched="$1"; shift
    pids=()
    for f in "$@"; do
      for _ in $(seq 1 50); do [ -s "$f" ] && break; sleep 0.1; done
      [ -s "$f" ] && pids+=("$(cat "$f")")
    done
    running() { for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
    while kill -0 "$watched" 2>/dev/null && running; do sleep 1; done
    for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    exit 0' broker-watch "$watched" "$@" >/dev/null 2>&1 </dev/null &
}
