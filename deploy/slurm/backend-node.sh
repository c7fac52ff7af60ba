#!/usr/bin/env bash
# One node's LLM backends: started by backends.sbatch through `srun`, one job step per node.
# Starts BACKENDS_PER_NODE copies of BACKEND_COMMAND (vLLM by default), each on its own port and its own
# TENSOR_PARALLEL GPUs, announces each once it answers GET /health, and stays until they exit.
set -euo pipefail
source "$DEPLOY_DIR/config.sh"

host=${NODE_ADDRESS:-$(hostname)}   # the address others reach it by
node=$(hostname)                    # its name in the run directory (unique even when NODE_ADDRESS is not)
mkdir -p "$RUN_DIR/logs"
# the GPUs Slurm gave this job on this node (ids as CUDA sees them), split TENSOR_PARALLEL at a time
IFS=, read -r -a gpus <<<"${CUDA_VISIBLE_DEVICES:-}"

backends=() announcers=()
trap 'log "signal: stopping backends ${backends[*]}"; stop_and_reap "${backends[@]}"' TERM INT
for i in $(seq 0 $(( BACKENDS_PER_NODE - 1 ))); do
  port=$(( BACKEND_PORT + i ))
  mine=("${gpus[@]:$(( i * TENSOR_PARALLEL )):$TENSOR_PARALLEL}")
  devices=$(IFS=,; echo "${mine[*]}")
  env PORT="$port" ${devices:+CUDA_VISIBLE_DEVICES="$devices"} bash -c "exec $BACKEND_COMMAND" \
      >"$RUN_DIR/logs/backend-$node-$i.log" 2>&1 &
  backends+=($!)
  log "backend $i: pid $! on port $port${devices:+, GPUs $devices}"
  "$PRORL_SERVER" slurm announce --run-dir "$RUN_DIR" --role backend --name "$node-$i" \
      --address "http://$host:$port/v1" --health "http://$host:$port/health" --pid "$!" --timeout "$READY_TIMEOUT" &
  announcers+=($!)
done

await_announcers backend "${backends[@]}"
reap "${backends[@]}"
log "backends exited"
