#!/usr/bin/env bash
# Enqueue jobs with curl: one per PAYLOAD_JSON argument, or one per line of stdin. Prints their ids.
#
#   examples/shell/produce.sh emails '{"to": "ada@example.com"}' '{"to": "bob@example.com"}'
#   jq -c '.[]' addresses.json | examples/shell/produce.sh emails
#
# JOBQ_URL (default http://127.0.0.1:8000) and JOBQ_TOKEN as for the other clients. Needs curl and jq.
set -euo pipefail

JOBQ=${JOBQ_URL:-http://127.0.0.1:8000}
queue=${1:?usage: produce.sh QUEUE [PAYLOAD_JSON ...]}
shift
auth=()
if [[ -n ${JOBQ_TOKEN:-} ]]; then auth=(-H "Authorization: Bearer $JOBQ_TOKEN"); fi

enqueue() {
  local job answer key
  job=$(jq -cn --arg queue "$queue" --argjson payload "$1" '{queue: $queue, payload: $payload}')
  # Retried when the service cannot be reached or answers 503; a refusal (4xx) prints its detail and stops.
  # One Idempotency-Key per job, the same on every retry: a retry after a lost answer cannot enqueue twice.
  key=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  answer=$(curl -sS --retry 5 --retry-connrefused "${auth[@]}" -H "Idempotency-Key: $key" \
    -H 'Content-Type: application/json' -d "$job" "$JOBQ/jobs")
  if ! jq -e .id <<<"$answer" >/dev/null; then
    echo "produce.sh: $(jq -r '"\(.detail) (\(.code))"' <<<"$answer" 2>/dev/null || echo "$answer")" >&2
    return 1
  fi
  jq -r .id <<<"$answer"
}

if (($#)); then
  for payload in "$@"; do enqueue "$payload"; done
else
  while IFS= read -r payload; do
    if [[ -n $payload ]]; then enqueue "$payload"; fi
  done
fi
