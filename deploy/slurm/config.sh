# Every knob of the Slurm deployment, with its default. Set any of them in the environment of
# `deploy/slurm/launch.sh` (sbatch passes the environment on to the jobs); this file is sourced by every
# script here and only fills in what is unset.

# --- where things go --------------------------------------------------------------------------------
# The run directory: announcements, logs and the endpoints file. It must be on a filesystem that every
# node and the trainer see (home or project space, not node-local /tmp).
: "${RUN_DIR:=$PWD/prorl-run}"
# The prorl-server command on the nodes (a path into a venv on the shared filesystem, say).
: "${PRORL_SERVER:=prorl-server}"
# Seconds a server or backend may take to answer its health check, and all of them to be registered.
: "${READY_TIMEOUT:=1800}"
# Seconds between checks that the other job of the deployment still runs (each ends itself without it).
: "${WATCH_INTERVAL:=10}"
# The name the trainer and the other nodes reach a node by (empty: the node's `hostname`). Set it only
# when that name does not resolve on the cluster network, e.g. to 127.0.0.1 on a one-node setup.
: "${NODE_ADDRESS:=}"
# Time limit of both jobs (sbatch --time), and extra sbatch options for both (account, QoS, ...).
: "${TIME_LIMIT:=24:00:00}"
: "${SBATCH_EXTRA:=}"

# --- rollout servers, on CPU nodes -------------------------------------------------------------------
: "${SERVER_NODES:=1}"            # nodes
: "${SERVER_PARTITION:=}"         # partition (empty: the cluster's default)
: "${SERVER_CPUS_PER_NODE:=}"     # cores per node (empty: the whole node, sbatch --exclusive)
: "${SERVERS_PER_NODE:=1}"        # prorl-server processes per node, sharing its cores
: "${SERVER_PORT:=8000}"          # server i on a node listens on SERVER_PORT + i
: "${SERVER_BIND:=0.0.0.0}"       # address the servers bind (other nodes must reach them)
# The servers require an API key: $PRORL_API_KEY when it is set, else the key in the submitting user's key
# file ($PRORL_API_KEY_FILE, else ~/.config/prorl-server/api_key; the first server to start makes it), which
# the registration step and the trainer's client read too: it must be on a filesystem every node and the
# trainer see (the home directory on most clusters). NO_API_KEY=1 serves without a key (`serve --no-api-key`):
# anyone on the cluster network could then submit jobs, register backends and stop the servers.
: "${NO_API_KEY:=0}"
# Workers per server; empty: sized by the server's share of the node's cores (c):
# INIT = c (sandbox starts), RUN = 8 c (agent loops mostly wait for the LLM), EVAL = c (scoring).
: "${INIT_WORKERS:=}"
: "${RUN_WORKERS:=}"
: "${EVAL_WORKERS:=}"
: "${SANDBOX_RUNTIME:=auto}"      # --runtime: apptainer, bwrap, local or auto
: "${SANDBOX_IMAGE:=}"            # --image: the default sandbox image (.sif for Apptainer)
# --sandbox-dir: the sandboxes' host-side files; empty: the node's local scratch, $TMPDIR on the node
# (Slurm sites often point it at a job-local disk), else /tmp
: "${SANDBOX_DIR:=}"
: "${SERVER_ARGS:=}"              # more `prorl-server serve` flags (handlers, policies, ...), word-split

# --- LLM backends, on GPU nodes ----------------------------------------------------------------------
: "${BACKEND_NODES:=1}"           # nodes
: "${BACKEND_PARTITION:=}"        # partition (empty: the cluster's default)
: "${BACKEND_CPUS_PER_NODE:=}"    # cores per node (empty: the whole node, sbatch --exclusive)
: "${GPUS_PER_NODE:=8}"           # GPUs per node (sbatch --gpus-per-node; 0: none, as in the tests)
: "${TENSOR_PARALLEL:=1}"         # GPUs per backend
# backends per node: one per TENSOR_PARALLEL GPUs (at least one)
: "${BACKENDS_PER_NODE:=$(( GPUS_PER_NODE / TENSOR_PARALLEL > 0 ? GPUS_PER_NODE / TENSOR_PARALLEL : 1 ))}"
: "${BACKEND_PORT:=8100}"         # backend i on a node listens on BACKEND_PORT + i
: "${MODEL:=}"                    # the model vLLM serves (a path or a Hugging Face id)
# The backend command, run by bash with $PORT (and $CUDA_VISIBLE_DEVICES: this backend's GPUs) set.
# It must serve vLLM's HTTP protocol on $PORT with GET /health; replace it to run another engine.
: "${BACKEND_COMMAND:=vllm serve \"\$MODEL\" --host 0.0.0.0 --port \"\$PORT\" --tensor-parallel-size \"\$TENSOR_PARALLEL\" --enable-prefix-caching --scheduling-policy priority}"

export RUN_DIR PRORL_SERVER READY_TIMEOUT WATCH_INTERVAL NODE_ADDRESS SERVERS_PER_NODE SERVER_PORT SERVER_BIND \
  NO_API_KEY INIT_WORKERS RUN_WORKERS EVAL_WORKERS SANDBOX_RUNTIME SANDBOX_IMAGE SANDBOX_DIR SERVER_ARGS \
  BACKEND_NODES BACKENDS_PER_NODE BACKEND_PORT TENSOR_PARALLEL MODEL BACKEND_COMMAND

log() { echo "[$(date +%H:%M:%S) $(hostname -s) ${SLURM_JOB_ID:-}] $*"; }

# job_gone JOBID: true only when Slurm answers and the job is no longer pending or running
# (a failed query, such as a busy controller, counts as "still there")
job_gone() {
  local out
  if out=$(squeue -h -j "$1" -o %T 2>&1); then
    [ -z "$out" ] || [[ "$out" =~ ^(COMPLETED|CANCELLED|FAILED|TIMEOUT|NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY) ]]
  else
    [[ "$out" == *"Invalid job id"* ]]
  fi
}

# start_node_steps SCRIPT: SCRIPT on each node of the job, each node its own job step (srun in the
# background; PIDs in $steps, nodes in $step_nodes). Slurm kills every step with a task on a failed node, so
# one step over all nodes would end on each of them when one is lost; the jobs are submitted with --no-kill,
# so that Slurm then only takes the lost node out of the job.
start_node_steps() {
  local node
  for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do
    srun --nodes=1 --ntasks=1 --nodelist="$node" "$1" &
    steps+=($!) step_nodes+=("$node")
  done
}

# node_steps_over WHAT: whether this job's part of the service is over. While the service starts (no
# endpoints file yet) that is when any node's step has ended (a node that fails to start fails the launch);
# once it runs, when every node's step has (a lost node costs only its own WHAT). Logs each step that ended.
node_steps_over() {
  local i live=0
  for i in "${!steps[@]}"; do
    if kill -0 "${steps[$i]}" 2>/dev/null; then
      live=$(( live + 1 ))
    elif [ -n "${step_nodes[$i]}" ]; then
      log "the $1 on ${step_nodes[$i]} exited"
      step_nodes[$i]=""   # logged once
    fi
  done
  if [ -s "$RUN_DIR/endpoints.json" ]; then [ "$live" -eq 0 ]; else [ "$live" -lt "${#steps[@]}" ]; fi
}

# reap PID...: wait until each child has exited (a trapped signal interrupts `wait`: wait again)
reap() {
  local pid
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" 2>/dev/null || sleep 0.1; done
  done
}

# stop_and_reap PID...: SIGTERM each, then reap them
stop_and_reap() {
  kill -TERM "$@" 2>/dev/null || true
  reap "$@"
}

# await_announcers WHAT PID...: wait for each of this node's `slurm announce` calls ($announcers); when one
# failed (its process never became ready), stop PID... (this node's WHATs) and exit 1
await_announcers() {
  local what=$1 pid
  shift
  for pid in "${announcers[@]}"; do
    if ! wait "$pid"; then
      log "a $what did not become ready: stopping this node's ${what}s"
      stop_and_reap "$@"
      exit 1
    fi
  done
}
