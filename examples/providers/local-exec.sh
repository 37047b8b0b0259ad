#!/usr/bin/env bash
# An exec provider (docs/exec-provider.md) that runs each pool instance as a local
# `flotilla agent` process: the protocol's reference implementation, and a template for a
# cloud CLI (replace the bodies of launch, terminate and list).
#
#   local-exec.sh launch|terminate|list
#
# Environment (besides the protocol's FLOTILLA_INSTANCE_ID, FLOTILLA_NODE_*):
#   FLOTILLA_POOL_DIR         state: ID.pid, ID.slot, ID.type, ID.log, ID/ (agent data)  [required]
#   FLOTILLA_AGGREGATORS      the agents' --aggregators                                   [required for launch]
#   FLOTILLA_JOIN_TOKEN_FILE  the agents' --join-token-file                               [optional]
#   FLOTILLA_CA               the agents' --ca                                            [optional]
#   FLOTILLA_BIN              the flotilla binary (default: flotilla on PATH)
#   FLOTILLA_PORT_BASE        first port of slot 0; each agent gets 50 (default 20000)
#   FLOTILLA_STOP_GRACE       seconds between SIGTERM and SIGKILL (default 10)
#
# Needs bash and util-linux's setsid (flock is used when present). No JSON parser: it reads
# the protocol's plain variables, not FLOTILLA_NODE_RESOURCES / FLOTILLA_NODE_LABELS.
set -euo pipefail

dir=${FLOTILLA_POOL_DIR:?FLOTILLA_POOL_DIR is not set}
mkdir -p "$dir"

die() { echo "local-exec: $*" >&2; exit 1; }

check_name() { # the value must be safe in a file name and in JSON without escaping
  [[ $2 =~ ^[A-Za-z0-9._-]{1,128}$ && $2 != . && $2 != .. ]] || die "bad $1: '$2'"
}

# True when instance $1's agent runs: its pid is alive and has the id on its command line
# (a reused pid is some other process).
alive() {
  local pid
  pid=$(cat "$dir/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "$1"
}

# One launch/list/terminate at a time, so two launches do not pick the same port slot.
# (Not the SIGKILL helper, which sleeps.)
if [[ ${1:-} != _kill-later ]]; then
  exec 9>"$dir/.lock"
  if command -v flock >/dev/null; then flock 9; fi
fi

case "${1:-}" in
launch)
  id=${FLOTILLA_INSTANCE_ID:-}; check_name "instance id" "$id"
  type=${FLOTILLA_NODE_TYPE:-}; check_name "node type" "$type"
  alive "$id" && exit 0 # already launched: the id is the idempotency key
  used=" "
  for f in "$dir"/*.slot; do
    [[ -e $f ]] || continue
    other=$(basename "$f" .slot)
    [[ $other != "$id" ]] && alive "$other" && used+="$(cat "$f") "
  done
  slot=0
  while [[ $used == *" $slot "* ]]; do slot=$((slot + 1)); done
  first=$((${FLOTILLA_PORT_BASE:-20000} + slot * 50))
  last=$((first + 49))
  ((last <= 65535)) || die "no port range left for slot $slot"
  cpu=${FLOTILLA_NODE_CPU_MILLIS:?}
  args=(--log-format text agent --aggregators "${FLOTILLA_AGGREGATORS:?FLOTILLA_AGGREGATORS is not set}"
    --node-id "$id" --cores "$((cpu / 1000)).$(printf %03d $((cpu % 1000)))"
    --memory "${FLOTILLA_NODE_MEMORY_BYTES:?}" --data "$dir/$id" --port-range "$first-$last")
  if [[ -n ${FLOTILLA_JOIN_TOKEN_FILE:-} ]]; then args+=(--join-token-file "$FLOTILLA_JOIN_TOKEN_FILE"); fi
  if [[ -n ${FLOTILLA_CA:-} ]]; then args+=(--ca "$FLOTILLA_CA"); fi
  if ((${FLOTILLA_NODE_GPU:-0} > 0)); then args+=(--gpus "$FLOTILLA_NODE_GPU"); fi
  if [[ ${FLOTILLA_NODE_CORDONED:-} == true ]]; then args+=(--cordoned); fi # a warm pool's node
  while IFS= read -r l; do if [[ -n $l ]]; then args+=(--resource "$l"); fi; done <<<"${FLOTILLA_NODE_RESOURCE_LINES:-}"
  while IFS= read -r l; do if [[ -n $l ]]; then args+=(--label "$l"); fi; done <<<"${FLOTILLA_NODE_LABEL_LINES:-}"
  echo "$slot" >"$dir/$id.slot"
  echo "$type" >"$dir/$id.type"
  # Its own session and no inherited stdio or lock: the agent outlives this command (a
  # background job of a script is no group leader, so setsid execs in place and $! is
  # the agent).
  setsid "${FLOTILLA_BIN:-flotilla}" "${args[@]}" </dev/null >>"$dir/$id.log" 2>&1 9>&- &
  echo $! >"$dir/$id.pid"
  ;;
terminate)
  id=${FLOTILLA_INSTANCE_ID:-}; check_name "instance id" "$id"
  alive "$id" || exit 0 # already gone
  pid=$(cat "$dir/$id.pid")
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  # SIGKILL after the grace, from a detached helper so this command returns now.
  setsid "$0" _kill-later "$id" "$pid" </dev/null >/dev/null 2>&1 9>&- &
  ;;
_kill-later)
  sleep "${FLOTILLA_STOP_GRACE:-10}"
  if alive "$2" && [[ $(cat "$dir/$2.pid") == "$3" ]]; then kill -KILL -- "-$3" 2>/dev/null || kill -KILL "$3"; fi
  ;;
list)
  out="[" sep=""
  for f in "$dir"/*.pid; do
    [[ -e $f ]] || continue
    id=$(basename "$f" .pid)
    if alive "$id"; then
      out+="$sep{\"id\":\"$id\",\"node_type\":\"$(cat "$dir/$id.type" 2>/dev/null)\"}"
      sep=","
    else
      rm -f "$dir/$id.pid" "$dir/$id.slot" "$dir/$id.type" # gone: free its slot
    fi
  done
  echo "$out]"
  ;;
*)
  die "usage: $0 launch|terminate|list"
  ;;
esac
