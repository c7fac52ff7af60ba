#!/usr/bin/env bash
# A Slurm cluster on this machine, for the deployment tests (tests/launch/test_slurm*.py) and for trying deploy/slurm/
# without a cluster. Debian's slurm-wlm (22.05 on bookworm) + munge; no systemd, no cgroups; everything
# (config, munge key and socket, state, logs, PIDs, what was created) under one base directory.
#
#   bash scripts/setup-slurm.sh install   # apt-get install slurm-wlm munge (iproute2) where missing (root)
#   bash scripts/setup-slurm.sh start     # one node (this host, on 127.0.0.1): munged, slurmctld, slurmd; wait for idle
#   bash scripts/setup-slurm.sh start --nodes N   # N >= 2 nodes n1..nN, each its own network namespace,
#                                         # address and hostname (scripts/slurm-nodes.sh; root)
#   bash scripts/setup-slurm.sh stop      # cancel every job, stop the daemons by the PIDs `start` recorded, remove
#                                         # what start created; exit 1 if anything was left behind
#   bash scripts/setup-slurm.sh env       # prints `export SLURM_CONF=...` (the clients need it)
#
# Knobs (environment):
#   PRORL_SLURM_BASE       base directory                           (default /tmp/prorl-slurm-$(id -u))
#   PRORL_SLURM_PORTS      "CTLD_PORT SLURMD_PORT"                  (default: two free ports, picked at start)
#   PRORL_SLURM_KILL_WAIT  seconds between scancel's SIGTERM and SIGKILL (default 30, Slurm's own default)
#   PRORL_SLURM_SLURMD_TIMEOUT  seconds of silence after which slurmctld marks a node DOWN (SlurmdTimeout;
#                          default 30; the lost-node tests take 5)
#
# $BASE/run/nodes lists the nodes, "NAME ADDRESS NETNS SWITCH_NETNS PORT" (PORT: the node's link on the
# switch's bridge; the one-node mode has no namespaces and writes "-" for the last three).
# Multi-node knobs: see scripts/slurm-nodes.sh.
#
# Measured on a 2-core VM: install about 7-11 s, start to an idle node about 0.5 s.
# Known limits: no accounting (`sacct` is off; finished jobs are listed in $BASE/log/jobcomp.log); a job
# asking for more CPUs than the node has is refused at submission (EnforcePartLimits=ALL).
set -euo pipefail
set +m   # no job control: `setsid cmd &` must exec in place so that $! is the daemon's PID

BASE=${PRORL_SLURM_BASE:-/tmp/prorl-slurm-$(id -u)}
ETC=$BASE/etc; MUNGEDIR=$BASE/munge; SPOOL=$BASE/spool; LOGDIR=$BASE/log; RUNDIR=$BASE/run
SOCK=$MUNGEDIR/munge.socket.2
PIDS=$RUNDIR/started.pids            # "name pid" of every daemon this script started, in start order
NODES=$RUNDIR/nodes                  # the nodes, one a line (above)
KILL_WAIT=${PRORL_SLURM_KILL_WAIT:-30}
SLURMD_TIMEOUT=${PRORL_SLURM_SLURMD_TIMEOUT:-30}
export SLURM_CONF=$ETC/slurm.conf
NODE=$(hostname -s)
source "$(dirname "${BASH_SOURCE[0]}")/slurm-nodes.sh"

log() { echo "[setup-slurm] $*"; }
# wait_for TIMEOUT_S CMD... : poll CMD every 0.1 s until it succeeds
wait_for() {
  local end=$(( $(date +%s) + $1 )); shift
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -ge "$end" ] && return 1
    sleep 0.1
  done
}
munge_ok()    { munge -n --socket="$SOCK" | unmunge --socket="$SOCK"; }
ctld_up()     { scontrol ping 2>/dev/null | grep -q 'is UP'; }
node_idle()   { scontrol show node "$NODE" -o 2>/dev/null | grep -q 'State=IDLE '; }
queue_empty() { [ -z "$(squeue -h 2>/dev/null)" ] && scontrol ping >/dev/null 2>&1; }
# pid_is PID NAME : PID is alive and runs NAME (guards against a reused PID); a zombie counts as gone
pid_is() { [ -n "$1" ] && [ "$(cat /proc/"$1"/comm 2>/dev/null)" = "$2" ] &&
           ! grep -q '^State:[[:space:]]*Z' /proc/"$1"/status 2>/dev/null; }
gone()   { ! pid_is "$1" "$2"; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

start_daemon() {  # start_daemon NAME LOGFILE CMD... : in the foreground of its own session, PID recorded
  local name=$1 out=$2; shift 2
  setsid "$@" </dev/null >>"$out" 2>&1 &
  local pid=$!
  echo "$name $pid" >>"$PIDS"
  # in_ns execs through nsenter, unshare and sh: wait until the PID runs NAME
  wait_for 10 pid_is "$pid" "$name" || { log "$name (pid $pid) did not start:"; tail -20 "$out"; exit 1; }
}

do_install() {
  local missing=()
  if ! command -v sbatch >/dev/null || ! command -v slurmctld >/dev/null; then missing+=(slurm-wlm); fi
  command -v munged >/dev/null || missing+=(munge)
  command -v ip >/dev/null || missing+=(iproute2)   # the multi-node mode's namespaces
  if [ ${#missing[@]} -eq 0 ]; then log "Slurm is installed: $(slurmd -V)"; return 0; fi
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
    log "${missing[*]} missing, and installing needs root and apt-get"; exit 3
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  log "installed $(slurmd -V)"
}

# shared_conf SCHEDULER_PARAMETERS : the slurm.conf lines the one-node and the multi-node cluster share
shared_conf() {
  cat <<EOF
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
StateSaveLocation=$SPOOL/slurmctld
SlurmctldPidFile=$RUNDIR/slurmctld.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
# no cgroups: processes are tracked by parentage, as on a node without the cgroup plugins
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGDIR/jobcomp.log
SwitchType=switch/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=$1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# refuse at submission what can never run (else it pends forever)
EnforcePartLimits=ALL
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=$SLURMD_TIMEOUT
InactiveLimit=0
KillWait=$KILL_WAIT
Waittime=0
EOF
}

write_conf() {
  local ctld_port=$1 slurmd_port=$2 hw
  # `slurmd -C` prints the node's real CPUs, cores and memory; using them exactly avoids a drained node
  hw=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$NODE/")
  {
    cat <<EOF
# single-node test cluster, written by scripts/setup-slurm.sh
ClusterName=prorltest
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmdSpoolDir=$SPOOL/slurmd
SlurmdPidFile=$RUNDIR/slurmd.pid
SlurmdLogFile=$LOGDIR/slurmd.log
EOF
    # the default batch_sched_delay=3 makes back-to-back submissions wait up to 3 s
    shared_conf batch_sched_delay=0
    echo "$hw State=UNKNOWN NodeAddr=127.0.0.1"
    echo "PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP"
  } >"$SLURM_CONF"
}

not_running() {
  local name pid
  if [ -s "$PIDS" ]; then
    while read -r name pid; do
      if pid_is "$pid" "$name"; then log "already running ($name pid $pid): run '$0 stop' first"; exit 1; fi
    done <"$PIDS"
  fi
  command -v slurmctld >/dev/null || { log "Slurm is not installed: run '$0 install' (root)"; exit 3; }
}

fresh_dirs() {  # fresh state every time (job ids start at 1); the munge key is kept
  rm -rf "$SPOOL" "$RUNDIR" "$LOGDIR"
  mkdir -p "$ETC" "$MUNGEDIR" "$SPOOL/slurmctld" "$SPOOL/slurmd" "$LOGDIR" "$RUNDIR"
  chmod 755 "$BASE" "$MUNGEDIR"   # munged refuses writable dirs; other users' clients need to reach the socket
  if [ ! -s "$MUNGEDIR/munge.key" ]; then
    mungekey --create --keyfile="$MUNGEDIR/munge.key" 2>/dev/null ||
      dd if=/dev/urandom of="$MUNGEDIR/munge.key" bs=1024 count=1 status=none
  fi
  chmod 600 "$MUNGEDIR/munge.key"
}

start_munged() {
  start_daemon munged "$LOGDIR/munged.log" munged --foreground --socket="$SOCK" \
      --key-file="$MUNGEDIR/munge.key" --pid-file="$RUNDIR/munged.pid" --seed-file="$MUNGEDIR/munged.seed"
  wait_for 15 munge_ok || { log "munged is not answering"; tail "$LOGDIR/munged.log"; exit 1; }
}

do_start() {
  fresh_dirs
  local ports; read -r -a ports <<<"${PRORL_SLURM_PORTS:-$(free_port) $(free_port)}"
  write_conf "${ports[0]}" "${ports[1]}"
  echo "$NODE 127.0.0.1 - - -" >"$NODES"
  start_munged
  start_daemon slurmctld "$LOGDIR/slurmctld.out" slurmctld -D -f "$SLURM_CONF"
  wait_for 30 ctld_up || { log "slurmctld is not up"; tail -30 "$LOGDIR/slurmctld.log"; exit 1; }
  start_daemon slurmd "$LOGDIR/slurmd.out" slurmd -D -f "$SLURM_CONF"
  wait_for 60 node_idle || { log "node $NODE is not idle"; tail -30 "$LOGDIR/slurmd.log"; exit 1; }
  log "node $NODE idle (ports ${ports[*]}); daemons: $(tr '\n' ' ' <"$PIDS")"
}

do_stop() {
  local t0; t0=$(date +%s.%N)
  if [ ! -s "$PIDS" ] && [ ! -s "$CREATED" ]; then log "nothing recorded in $RUNDIR"; return 0; fi
  # 1) cancel every job first, so that no slurmstepd (reparented to PID 1) outlives slurmd
  if [ -s "$PIDS" ] && ctld_up; then
    squeue -h -o %i | xargs -r scancel || true
    wait_for $(( KILL_WAIT + 30 )) queue_empty || log "warning: jobs still listed: $(squeue -h)"
  fi
  # 2) the daemons by recorded PID, in reverse start order: slurmd, slurmctld, munged
  local name pid left=0
  if [ -s "$PIDS" ]; then
    while read -r name pid; do
      if pid_is "$pid" "$name"; then
        kill -TERM "$pid"
        wait_for 20 gone "$pid" "$name" || { log "$name (pid $pid) ignored SIGTERM: SIGKILL"; kill -KILL "$pid" || true; }
        log "stopped $name (pid $pid)"
      fi
    done < <(tac "$PIDS")
    while read -r name pid; do
      if ! wait_for 5 gone "$pid" "$name"; then log "LEFT BEHIND: $name pid $pid"; left=1; fi
    done <"$PIDS"
  fi
  # 3) the multi-node mode's namespaces (and what is left in them), links and /etc/hosts block
  stop_nodes || left=1
  [ "$left" = 0 ] || return 1
  rm -f "$PIDS"
  log "stopped in $(elapsed "$t0") s, nothing left behind"
}

nodes_arg() {  # nodes_arg ARGS... : N from `--nodes N` (1 without it)
  case "$*" in
    "") echo 1 ;;
    "--nodes "*) [[ "$2" =~ ^[1-9][0-9]*$ ]] && [ "$2" -le 200 ] && [ $# -eq 2 ] && echo "$2" ||
                 { log "--nodes takes a number of nodes, 1 to 200" >&2; exit 2; } ;;
    *) log "start takes only --nodes N" >&2; exit 2 ;;
  esac
}

case "${1:-}" in
  install) do_install ;;
  start)   n=$(nodes_arg "${@:2}"); not_running
           if [ "$n" -eq 1 ]; then do_start; else start_nodes "$n"; fi ;;
  stop)    do_stop ;;
  env)     echo "export SLURM_CONF=$SLURM_CONF" ;;
  *) echo "usage: $0 install|start [--nodes N]|stop|env" >&2; exit 2 ;;
esac
