#!/usr/bin/env bash
# A jobq worker in shell: runs COMMAND for each job of QUEUE, with the job's payload (JSON) on its stdin
# and JOBQ_JOB_ID and JOBQ_ATTEMPT in its environment. Exit status 0 acks the job (and its output is
# printed); any other nacks it, with the status and the last lines of the command's output as its error.
#
#   examples/shell/worker.sh emails ./send-email.sh
#
# SIGTERM or SIGINT: no more leases (a waiting long-poll ends at once; a job it brings as the signal comes
# is given back); the job in hand finishes, then it exits. A job's lease lasts the queue's visibility
# timeout (30 s unless configured): give the queue a longer one for longer commands.
# JOBQ_URL (default http://127.0.0.1:8000) and JOBQ_TOKEN as for the other clients. Needs curl and jq.
set -uo pipefail

JOBQ=${JOBQ_URL:-http://127.0.0.1:8000}
queue=${1:?usage: worker.sh QUEUE COMMAND [ARG ...]}
shift
if ((!$#)); then echo "usage: worker.sh QUEUE COMMAND [ARG ...]" >&2; exit 2; fi
auth=()
if [[ -n ${JOBQ_TOKEN:-} ]]; then auth=(-H "Authorization: Bearer $JOBQ_TOKEN"); fi
answer=$(mktemp)
trap 'rm -f "$answer"' EXIT

post() { # PATH JSON: the answer in $answer
  curl -sS --retry 5 --retry-connrefused "${auth[@]}" \
    -H 'Content-Type: application/json' -d "$2" "$JOBQ$1" >"$answer"
}

# The long-poll, run in the background so that a signal ends the wait at once. It is curl itself (exec),
# not a subshell running it: killing $poll must end the request and close its connection, which tells
# the service to claim nothing more for this worker (a killed subshell would leave curl polling, and
# the job it got would stay running for nobody until its lease expired, its attempt counted).
lease_request=$(jq -cn --arg queue "$queue" '{queue: $queue, wait: 20}')
long_poll() {
  exec curl -sS --retry 5 --retry-connrefused "${auth[@]}" \
    -H 'Content-Type: application/json' -d "$lease_request" "$JOBQ/lease" >"$answer"
}

# Stopping during a long-poll: end it and wait until curl has gone, its connection closed with it.
# Jobs its answer brought anyway (it came as the signal did) are given back untouched: pending again
# at once, their attempt not counted. SIGKILL, which nothing can catch: for a moment after the fork, the
# background shell still has this script's TERM trap, and a TERM landing then would run that trap's
# copy, not end it, and the exec'd curl would poll on for its whole wait.
give_back() {
  kill -KILL "$poll" 2>/dev/null
  while kill -0 "$poll" 2>/dev/null; do wait "$poll" 2>/dev/null; done
  local leased
  leased=$(jq -c '[.jobs[]? | {id, lease_token}]' "$answer" 2>/dev/null) # nothing if curl was cut short
  if [[ -n $leased && $leased != "[]" ]]; then
    post /release "{\"items\": $leased}"
    jq -r '.results[]? | "job \(.id) " + if .ok then "given back" else "not given back (\(.code))" end' \
      "$answer"
  fi
}

stopping=0 poll=
trap 'stopping=1; if [[ -n $poll ]]; then kill -KILL "$poll" 2>/dev/null; fi' TERM INT
echo "working on $queue at $JOBQ: $*"
while ((!stopping)); do
  : >"$answer" # curl killed before it opened $answer must not leave an older answer to give back
  long_poll &
  poll=$!
  # A signal that came before $poll was set could not end the wait: look once more.
  if ((stopping)); then break; fi
  wait "$poll"
  status=$?
  if ((stopping)); then break; fi
  poll=
  if ((status)); then
    echo "lease: $(cat "$answer"); trying again" >&2
    sleep 1
    continue
  fi
  if jq -e .code "$answer" >/dev/null; then # refused: a bad token, a bad queue name, 503 for long
    echo "lease: $(jq -r '"\(.detail) (\(.code))"' "$answer"); trying again" >&2
    sleep 1
    continue
  fi
  id=$(jq -r '.jobs[0].id // empty' "$answer")
  if [[ -z $id ]]; then continue; fi
  lease=$(jq -c '.jobs[0] | {id, lease_token}' "$answer")
  attempt=$(jq -r '.jobs[0].attempts' "$answer")

  output=$(jq -c '.jobs[0].payload' "$answer" | JOBQ_JOB_ID=$id JOBQ_ATTEMPT=$attempt "$@" 2>&1)
  status=$?
  if ((status == 0)); then
    if [[ -n $output ]]; then printf '%s\n' "$output"; fi
    post /ack "$lease"
    outcome=done
  else
    error=$(printf 'exit status %d\n%s' "$status" "$(tail -n 20 <<<"$output")")
    post /nack "$(jq -c --arg error "$error" '. + {error: $error}' <<<"$lease")"
    outcome="failed with exit status $status"
  fi
  if jq -e .code "$answer" >/dev/null; then # lease_lost: the lease expired and another worker has it
    echo "job $id: $(jq -r .detail "$answer")" >&2
  else
    echo "job $id $outcome"
  fi
done
if [[ -n $poll ]]; then give_back; fi
echo "stopped"
