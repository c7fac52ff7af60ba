#!/usr/bin/env bash
# Launch the rollout service on Slurm with one command, and wait until trainers can use it:
#
#   MODEL=/models/Qwen3-8B GPUS_PER_NODE=4 BACKEND_NODES=2 SERVER_NODES=2 RUN_DIR=$HOME/rollout \
#       deploy/slurm/launch.sh
#
# It submits two jobs: servers.sbatch (rollout servers on CPU nodes; the service's main job) and
# backends.sbatch (LLM backends on GPU nodes), sized by the knobs in config.sh. Once every server and
# backend answers, the servers job registers the backends with the servers (each server first gets the
# backends on its own node, the rest are spread evenly) and writes $RUN_DIR/endpoints.json, which this
# script waits for and prints. `scancel <servers job>` stops everything; the last line printed says so.
# WAIT=0 returns right after submission.
set -euo pipefail
DEPLOY_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export DEPLOY_DIR
source "$DEPLOY_DIR/config.sh"
: "${WAIT:=1}"

RUN_DIR=$(realpath -m "$RUN_DIR")
if [ -e "$RUN_DIR/servers.jobid" ]; then
  echo "launch.sh: $RUN_DIR was used by an earlier launch (servers job $(cat "$RUN_DIR/servers.jobid")); choose another RUN_DIR" >&2
  exit 2
fi
if [ -e "$RUN_DIR/endpoints.json" ]; then   # it would pass for this launch's at once, naming servers long gone
  echo "launch.sh: $RUN_DIR/endpoints.json exists (an earlier launch's); choose another RUN_DIR" >&2
  exit 2
fi
if [[ "$BACKEND_COMMAND" == *'$MODEL'* ]] && [ -z "$MODEL" ]; then
  echo "launch.sh: set MODEL to the model vLLM should serve (or set BACKEND_COMMAND)" >&2
  exit 2
fi
mkdir -p "$RUN_DIR/logs"

# sbatch options of one job: resources NODES PARTITION CPUS_PER_NODE GPUS_PER_NODE
resources() {
  local args=(--parsable --nodes "$1" --time "$TIME_LIMIT" --output "$RUN_DIR/logs/%x-%j.out")
  [ -n "$2" ] && args+=(--partition "$2")
  if [ -n "$3" ]; then args+=(--cpus-per-task "$3"); else args+=(--exclusive); fi
  [ "${4:-0}" -gt 0 ] && args+=(--gpus-per-node "$4")
  echo "${args[@]}"
}

# shellcheck disable=SC2046,SC2086  # option lists are word-split on purpose
servers_job=$(sbatch $(resources "$SERVER_NODES" "$SERVER_PARTITION" "$SERVER_CPUS_PER_NODE" 0) $SBATCH_EXTRA \
    "$DEPLOY_DIR/servers.sbatch" | cut -d';' -f1)
echo "$servers_job" >"$RUN_DIR/servers.jobid"
# shellcheck disable=SC2046,SC2086
if ! backends_job=$(SERVERS_JOB=$servers_job sbatch \
    $(resources "$BACKEND_NODES" "$BACKEND_PARTITION" "$BACKEND_CPUS_PER_NODE" "$GPUS_PER_NODE") $SBATCH_EXTRA \
    "$DEPLOY_DIR/backends.sbatch" | cut -d';' -f1); then
  scancel "$servers_job"
  exit 1
fi
echo "$backends_job" >"$RUN_DIR/backends.jobid"
echo "launch.sh: servers job $servers_job ($SERVER_NODES nodes x $SERVERS_PER_NODE servers), backends job" \
     "$backends_job ($BACKEND_NODES nodes x $BACKENDS_PER_NODE backends); logs in $RUN_DIR/logs"
[ "$WAIT" = 1 ] || { echo "launch.sh: stop with: scancel $servers_job"; exit 0; }

waited=0
until [ -s "$RUN_DIR/endpoints.json" ]; do
  if job_gone "$servers_job"; then
    echo "launch.sh: servers job $servers_job ended before the endpoints file was written; its log:" >&2
    tail -n 30 "$RUN_DIR/logs/prorl-servers-$servers_job.out" >&2 || true
    exit 1
  fi
  sleep 1; waited=$(( waited + 1 ))
  (( waited % 30 == 0 )) && echo "launch.sh: waiting ($(squeue -h -j "$servers_job,$backends_job" -o '%i %T %R' | tr '\n' ' '))"
done
echo "launch.sh: ready: $RUN_DIR/endpoints.json"
cat "$RUN_DIR/endpoints.json"; echo
echo "launch.sh: stop with: scancel $servers_job"
