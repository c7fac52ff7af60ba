# The multi-node parts of scripts/setup-slurm.sh (sourced by it, not run): `start --nodes N` builds N Slurm
# nodes on this one machine, each a network namespace plus a UTS namespace with its own address, hostname and
# port space, running its own `slurmd -N <node>`; `stop` undoes everything `start` recorded.
#
#  host netns ("login node": sbatch/squeue/scancel, munged, the tests)   ${ID}h   = $SUBNET.1   --+
#  netns $ID-sw   : bridge br0, the switch (its own netns: host firewalls never see bridged traffic) <-+
#  netns $ID-ctl  : hostname $ID-ctl, eth0 $SUBNET.2, slurmctld on 6817                              --+
#  netns $ID-nI   : hostname ${PREFIX}I, eth0 $SUBNET.(10+I), slurmd -N ${PREFIX}I on 6818           --+
#
# No namespace has a default route (only the /24 and each namespace's loopback are reachable) and IPv6 is off
# in all of them. /etc/hosts gets a marked block naming every node (appended in place, removed on stop), so
# the host and the jobs reach nodes by hostname. munged runs in the host netns: its socket is a file path,
# reachable from every namespace. Filesystem, PID namespace and /proc are shared, as a cluster's shared home.
#
# Knobs (environment), besides setup-slurm.sh's; two clusters can run at once with distinct values of all three:
#   PRORL_SLURM_ID      tag of namespace and link names and of the /etc/hosts block (default prs; <= 8 chars)
#   PRORL_SLURM_SUBNET  first three octets of the private /24                       (default 10.217.0)
#   PRORL_SLURM_PREFIX  node name prefix: nodes ${PREFIX}1..N                        (default n)
# Exit status 4 from `start`: one of those is in use (a subnet, namespace, link or host name); pick others.

ID=${PRORL_SLURM_ID:-prs}
SUBNET=${PRORL_SLURM_SUBNET:-10.217.0}
PREFIX=${PRORL_SLURM_PREFIX:-n}
CREATED=$RUNDIR/created        # "kind name" of every namespace / link / hosts block created, in order
SW_NS=$ID-sw                   # the switch's namespace
HOST_VETH=${ID}h               # the host's link into it
HOST_ADDR=$SUBNET.1
CTLD_NAME=$ID-ctl CTLD_ADDR=$SUBNET.2
HOSTS_BEGIN="# BEGIN prorl-slurm $ID"
HOSTS_END="# END prorl-slurm $ID"
LOCK=/run/lock/prorl-slurm-nodes.lock   # serialises the in-use checks and creation of concurrent starts

node_name() { echo "$PREFIX$1"; }
node_ns()   { echo "$ID-$PREFIX$1"; }
node_addr() { echo "$SUBNET.$(( 10 + $1 ))"; }
record()    { echo "$*" >>"$CREATED"; }
in_use()    { log "in use: $*"; exit 4; }
ns_pids()   { ip netns pids "$1" 2>/dev/null || true; }
ns_empty()  { [ -z "$(ns_pids "$1")" ]; }
elapsed()   { python3 -c "print(round($(date +%s.%N) - $1, 2))"; }

check_free() {  # check_free N : exit 4 when a name or the subnet is taken
  [[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { log "PRORL_SLURM_SUBNET must be three octets"; exit 2; }
  [ ${#ID} -le 8 ] || { log "PRORL_SLURM_ID must have at most 8 characters (link names)"; exit 2; }
  ip link show "$HOST_VETH" >/dev/null 2>&1 && in_use "link $HOST_VETH"
  ip netns list | grep -q "^$ID-" && in_use "network namespaces $ID-*"
  ip -4 -o addr show | grep -q " $SUBNET\." && in_use "$SUBNET.0/24 has an address here"
  ip -4 route show | grep -q "^$SUBNET\." && in_use "a route to $SUBNET.0/24"
  grep -qxF "$HOSTS_BEGIN" /etc/hosts && in_use "/etc/hosts has a '$HOSTS_BEGIN' block"
  local i
  for i in $(seq 1 "$1"); do
    getent hosts "$(node_name "$i")" >/dev/null && in_use "host name $(node_name "$i") resolves already"
  done
  getent hosts "$CTLD_NAME" >/dev/null && in_use "host name $CTLD_NAME resolves already"
  return 0
}

new_netns() {  # new_netns NAME : an IPv4-only namespace with its loopback up
  ip netns add "$1"; record netns "$1"
  ip netns exec "$1" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip -n "$1" link set lo up
}

make_network() {  # make_network N : the switch, the host's link, the controller's and N nodes' namespaces
  local i ns
  new_netns "$SW_NS"
  ip -n "$SW_NS" link add br0 type bridge
  ip -n "$SW_NS" link set br0 up
  ip link add "$HOST_VETH" type veth peer name host netns "$SW_NS"; record link "$HOST_VETH"
  sysctl -qw "net.ipv6.conf.$HOST_VETH.disable_ipv6=1"
  ip addr add "$HOST_ADDR/24" dev "$HOST_VETH"
  ip -n "$SW_NS" link set host master br0 up
  ip link set "$HOST_VETH" up
  for i in $(seq 0 "$1"); do   # 0: the controller; no default route anywhere
    if [ "$i" = 0 ]; then ns=$CTLD_NAME; else ns=$(node_ns "$i"); fi
    new_netns "$ns"
    ip -n "$SW_NS" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$SW_NS" link set "p$i" master br0 up
    if [ "$i" = 0 ]; then ip -n "$ns" addr add "$CTLD_ADDR/24" dev eth0; else ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0; fi
    ip -n "$ns" link set eth0 up
  done
  {
    echo "$HOSTS_BEGIN"
    echo "$HOST_ADDR $ID-host"
    echo "$CTLD_ADDR $CTLD_NAME"
    for i in $(seq 1 "$1"); do echo "$(node_addr "$i") $(node_name "$i")"; done
    echo "$HOSTS_END"
  } >"$ETC/hosts.block"
  cat "$ETC/hosts.block" >>/etc/hosts; record hosts "$ID"   # in place: /etc/hosts may be a bind mount
}

write_nodes_conf() {  # write_nodes_conf N
  local hw i
  hw=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')   # every node declares this machine's hardware
  {
    cat <<EOF
# $1-node test cluster on one machine (network + UTS namespaces), written by scripts/setup-slurm.sh
ClusterName=$ID
SlurmctldHost=$CTLD_NAME($CTLD_ADDR)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
# %n = node name: every slurmd its own spool directory, PID file and log
SlurmdSpoolDir=$SPOOL/slurmd-%n
SlurmdPidFile=$RUNDIR/slurmd-%n.pid
SlurmdLogFile=$LOGDIR/slurmd-%n.log
EOF
    # bf_interval=1: heterogeneous jobs are scheduled by backfill only, every bf_interval s (default 30)
    shared_conf batch_sched_delay=0,bf_interval=1
  } >"$SLURM_CONF"
  for i in $(seq 1 "$1"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") $hw State=UNKNOWN" >>"$SLURM_CONF"
  done
  echo "PartitionName=debug Nodes=${PREFIX}[1-$1] Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
}

# in_ns NS HOSTNAME : sets IN_NS to the command prefix that runs a command in network namespace NS under its
# own hostname, exec'd in place (so $! of `setsid "${IN_NS[@]}" cmd &` is cmd's PID). nsenter, not `ip netns
# exec`: that one mounts a fresh /sys, hiding /sys/fs/cgroup, and slurmd 22.05 then refuses to start
# ("Unable to initialize cgroup plugin").
in_ns() {
  IN_NS=(nsenter --net="/run/netns/$1" unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' sh "$2")
}

start_nodes() {  # start_nodes N : the whole cluster, rolled back (do_stop) if any step fails
  local n=$1 t0 i node
  [ "$(id -u)" -eq 0 ] || { log "start --nodes needs root (network namespaces, slurmd)"; exit 3; }
  local tool
  for tool in ip nsenter unshare slurmctld slurmd munged; do
    command -v "$tool" >/dev/null || { log "$tool is missing: run '$0 install' (root)"; exit 3; }
  done
  [ -s "$CREATED" ] && { log "$CREATED lists what an earlier start made: run '$0 stop' first"; exit 1; }
  t0=$(date +%s.%N)
  mkdir -p "$(dirname "$LOCK")"
  exec 9>"$LOCK"; flock 9
  check_free "$n"
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "start failed ($rc): rolling back"; do_stop || true; fi' EXIT
  fresh_dirs
  mkdir -p "$RUNDIR" && : >"$CREATED"
  for i in $(seq 1 "$n"); do mkdir -p "$SPOOL/slurmd-$(node_name "$i")"; done
  make_network "$n"
  exec 9>&-   # names and subnet are taken now: other starts may check theirs
  write_nodes_conf "$n"
  : >"$NODES"
  for i in $(seq 1 "$n"); do echo "$(node_name "$i") $(node_addr "$i") $(node_ns "$i") $SW_NS p$i" >>"$NODES"; done
  start_munged
  in_ns "$CTLD_NAME" "$CTLD_NAME"
  start_daemon slurmctld "$LOGDIR/slurmctld.out" "${IN_NS[@]}" slurmctld -D -f "$SLURM_CONF"
  wait_for 30 ctld_up || { log "slurmctld is not up"; tail -30 "$LOGDIR/slurmctld.log"; exit 1; }
  for i in $(seq 1 "$n"); do
    node=$(node_name "$i")
    in_ns "$(node_ns "$i")" "$node"
    start_daemon slurmd "$LOGDIR/slurmd-$node.out" "${IN_NS[@]}" slurmd -D -N "$node" -f "$SLURM_CONF"
  done
  all_idle() { [ "$(sinfo -h -N -t idle -o %N | sort -u | wc -l)" -eq "$n" ]; }
  wait_for 60 all_idle || { log "not all nodes idle: $(sinfo -N -h -o '%N %T %E' | tr '\n' ';')"; exit 1; }
  trap - EXIT
  log "$n nodes idle in $(elapsed "$t0") s: $(cut -d' ' -f1,2 "$NODES" | tr '\n' ' ')(SLURM_CONF=$SLURM_CONF)"
}

stop_nodes() {  # after the daemons: what is left in each namespace (by PID), namespaces, links, hosts block
  local kind name pid begin end kept left=()
  [ -s "$CREATED" ] || return 0
  while read -r kind name; do
    case $kind in
      netns)
        if ! ns_empty "$name"; then
          log "left in $name: $(ns_pids "$name" | tr '\n' ' ')- SIGTERM"
          for pid in $(ns_pids "$name"); do kill -TERM "$pid" 2>/dev/null || true; done
          wait_for 10 ns_empty "$name" || for pid in $(ns_pids "$name"); do kill -KILL "$pid" 2>/dev/null || true; done
          wait_for 5 ns_empty "$name" || true
        fi
        ip netns del "$name" 2>/dev/null || true ;;   # takes the veth pairs with an end in it along
      link)
        if ip link show "$name" >/dev/null 2>&1; then ip link del "$name"; fi ;;
      hosts)
        begin="# BEGIN prorl-slurm $name" end="# END prorl-slurm $name"
        if grep -qxF "$begin" /etc/hosts; then
          kept=$(awk -v b="$begin" -v e="$end" '$0 == b {skip = 1; next} $0 == e {skip = 0; next} !skip' /etc/hosts)
          printf '%s\n' "$kept" >/etc/hosts   # rewritten in place: /etc/hosts may be a bind mount
        fi ;;
    esac
  done < <(tac "$CREATED")
  while read -r kind name; do
    case $kind in
      netns) if ip netns list | grep -qE "^$name( |$)"; then left+=("namespace $name"); fi ;;
      link)  if ip link show "$name" >/dev/null 2>&1; then left+=("link $name"); fi ;;
      hosts) if grep -qxF "# BEGIN prorl-slurm $name" /etc/hosts; then left+=("/etc/hosts block $name"); fi ;;
    esac
  done <"$CREATED"
  if [ ${#left[@]} -gt 0 ]; then log "LEFT BEHIND: ${left[*]}"; return 1; fi
  rm -f "$CREATED" "$NODES"
}
