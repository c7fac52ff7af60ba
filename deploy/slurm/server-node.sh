#!/usr/bin/env bash
# One node's rollout servers: started by servers.sbatch through `srun`, one job step per node.
# Starts SERVERS_PER_NODE `prorl-server serve` processes, announces each once it answers GET /health,
# and stays until they exit. On SIGTERM (scancel) each server stops gracefully: live jobs cancelled,
# sandboxes closed; this script waits for that, because Slurm kills what is left once it returns.
set -euo pipefail
source "$DEPLOY_DIR/config.sh"

host=${NODE_ADDRESS:-$(hostname)}   # the address others reach it by
node=$(hostname)                    # its name in the run directory (unique even when NODE_ADDRESS is not)
cores=${SLURM_CPUS_ON_NODE:-$(nproc)}
share=$(( cores / SERVERS_PER_NODE > 0 ? cores / SERVERS_PER_NODE : 1 ))   # cores per server
mkdir -p "$RUN_DIR/logs"

key_flag=""   # the servers' key: $PRORL_API_KEY, else the user's key file (config.sh), unless NO_API_KEY=1
if [ "$NO_API_KEY" = 1 ]; then key_flag=--no-api-key; fi

cpus_flag=()   # servers sharing the node: each its own slice of its CPUs for the action scheduler
servers=() announcers=()
trap 'log "signal: stopping servers ${servers[*]}"; stop_and_reap "${servers[@]}"' TERM INT
for i in $(seq 0 $(( SERVERS_PER_NODE - 1 ))); do
  port=$(( SERVER_PORT + i ))
  if [ "$SERVERS_PER_NODE" -gt 1 ]; then
    cpus_flag=(--action-cpus "$("$PRORL_SERVER" slurm cpus --index "$i" --count "$SERVERS_PER_NODE")")
  fi
  # shellcheck disable=SC2086  # SERVER_ARGS is a list of flags, key_flag one or none
  "$PRORL_SERVER" serve --host "$SERVER_BIND" --port "$port" \
      --init-workers "${INIT_WORKERS:-$share}" --run-workers "${RUN_WORKERS:-$(( 8 * share ))}" \
      --eval-workers "${EVAL_WORKERS:-$share}" --runtime "$SANDBOX_RUNTIME" \
      --sandbox-dir "${SANDBOX_DIR:-${TMPDIR:-/tmp}}" \
      ${SANDBOX_IMAGE:+--image "$SANDBOX_IMAGE"} "${cpus_flag[@]}" $key_flag $SERVER_ARGS \
      >"$RUN_DIR/logs/server-$node-$i.log" 2>&1 &
  servers+=($!)
  log "server $i: pid $! on port $port, $share cores"
  "$PRORL_SERVER" slurm announce --run-dir "$RUN_DIR" --role server --name "$node-$i" \
      --address "http://$host:$port" --health "http://$host:$port/health" --pid "$!" --timeout "$READY_TIMEOUT" &
  announcers+=($!)
done

await_announcers server "${servers[@]}"
# until every server has exited (a signal interrupts `wait`; the trap then stops them all)
reap "${servers[@]}"
log "servers exited"
