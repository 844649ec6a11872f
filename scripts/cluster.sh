#!/usr/bin/env bash
# A cluster of K hosts on this machine, for running mpiml across hosts over TCP.
#
#   scripts/cluster.sh up [--slurm] [K]   K hosts (default 2): h1..hK; --slurm: with a Slurm
#                                         cluster on them (munged, slurmctld on h1, slurmd hI)
#   scripts/cluster.sh slurm CMD...       a command on h1 (the login node) for the Slurm
#                                         cluster: srun, sbatch, sinfo, scancel...
#   scripts/cluster.sh slurmd HOST stop|start  stop (kill) or start one host's slurmd
#   scripts/cluster.sh run [mpirun args]  mpirun on h1 (Open MPI; MPIML_CLUSTER_MPI=mpich: Hydra)
#   scripts/cluster.sh exec HOST CMD...   a command on one host (launcher settings and
#                                         MPIML_HOSTFILE set: mpi_fork spans the hosts)
#   scripts/cluster.sh link HOST up|down  cut or restore a host's link
#   scripts/cluster.sh shape "QDISC ARGS" shape every host's link, e.g. "netem delay 0.5ms
#                                         rate 1gbit" or "tbf rate 1gbit ..."; "" to clear
#   scripts/cluster.sh ps                 processes running on each host
#   scripts/cluster.sh check              exit 0 if up, else print why (77: cannot run here)
#   scripts/cluster.sh down               remove everything (also after a failed run)
#
# Host hI is a network namespace (eth0 = 198.18.0.I/24, RFC 2544 benchmarking
# range, and lo) plus a UTS namespace (host name hI) and a mount namespace with
# its own /dev/shm and an /etc/hosts naming h1..hK; the global /etc/hosts is not
# touched. The hosts' eth0 are veth pairs to a bridge in a switch namespace,
# so no address exists outside the namespaces and no traffic leaves them.
# Open MPI starts its daemons on the hosts through the rsh agent
# $MPIML_CLUSTER_DIR/agent (plm_rsh_agent); ranks on different hosts talk over
# TCP only (btl self,vader,tcp on eth0), ranks of one host over shared memory.
# MPIML_CLUSTER_DIR and MPIML_CLUSTER_PREFIX (default mpiml-) set apart a second
# cluster next to a running one. Needs root, ip netns, nsenter and unshare.
set -euo pipefail
dir=${MPIML_CLUSTER_DIR:-/run/mpiml-cluster}
prefix=${MPIML_CLUSTER_PREFIX:-mpiml-}
sw=${prefix}sw
net=198.18.0

die() { echo "cluster.sh: $*" >&2; exit 1; }

# Why this machine cannot host the cluster (empty if it can).
why_not() {
  [ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)"; return; }
  local t
  for t in ip nsenter unshare; do
    command -v "$t" > /dev/null || { echo "needs '$t'"; return; }
  done
  ip netns list > /dev/null 2>&1 || { echo "'ip netns' does not work here"; return; }
  local probe=${prefix}probe$$
  if ! ip netns add "$probe" > /dev/null 2>&1; then echo "cannot create a network namespace"; return; fi
  ip netns del "$probe"
  unshare --uts --mount true 2> /dev/null || echo "cannot create UTS/mount namespaces (unshare)"
}

hosts() { cat "$dir/hosts.list" 2> /dev/null; }
nhosts() { hosts | wc -l; }

enter() {  # enter HOST CMD...: run CMD in HOST's namespaces
  local h=$1; shift
  [ -e "$dir/ns/$h.uts" ] || die "no host '$h' (hosts: $(hosts | xargs))"
  nsenter --net=/run/netns/$prefix$h --uts="$dir/ns/$h.uts" --mount="$dir/ns/$h.mnt" --wd="$PWD" -- "$@"
}

cmd_down() {
  local h
  # Processes still running on a host were started through this script: end them.
  for h in $(hosts) $(ip netns list 2> /dev/null | awk '{print $1}' | sed -n "s/^$prefix\(h[0-9]*\)$/\1/p"); do
    local pids
    pids=$(ip netns pids "$prefix$h" 2> /dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2> /dev/null || true
  done
  for h in $(ip netns list 2> /dev/null | awk '{print $1}' | grep "^$prefix" || true); do
    ip netns del "$h" 2> /dev/null || true
  done
  if [ -d "$dir/ns" ]; then
    local f
    for f in "$dir"/ns/*; do [ -e "$f" ] && umount "$f" 2> /dev/null; done
    umount "$dir/ns" 2> /dev/null || true
  fi
  if [ -s "$dir/holder.pid" ]; then
    local hp; hp=$(cat "$dir/holder.pid")
    grep -qx "sleep infinity" < <(tr '\0' ' ' < /proc/$hp/cmdline 2> /dev/null | sed 's/ $//') && kill "$hp" 2> /dev/null || true
  fi
  rm -rf "$dir"
  echo "cluster: down"
}

cmd_up() {
  local slurm=0
  [ "${1:-}" = --slurm ] && { slurm=1; shift; }
  local k=${1:-2}
  [[ $k =~ ^[0-9]+$ ]] && [ "$k" -ge 1 ] && [ "$k" -le 200 ] || die "up: K must be 1..200"
  local why; why=$(why_not)
  if [ -n "$why" ]; then echo "cluster.sh: cannot build the cluster: $why" >&2; exit 77; fi
  [ $slurm = 0 ] || slurm_install
  [ -e "$dir/hosts.list" ] && cmd_down > /dev/null
  # whatever ends this before the end (an error, die, a signal) removes it all
  trap 'cmd_down > /dev/null 2>&1' EXIT
  mkdir -p "$dir/ns"
  # Persistent namespaces are bind mounts, which need a private mount to live on.
  mount --bind "$dir/ns" "$dir/ns"
  mount --make-private "$dir/ns"
  : > "$dir/hosts.list"
  {
    echo "127.0.0.1 localhost"
    for i in $(seq 1 "$k"); do echo "$net.$i h$i"; done
  } > "$dir/etc-hosts"
  : > "$dir/hostfile"
  # A process that stays in this mount namespace, where every host's namespace
  # files are mounted: the agent enters it first when started from a host.
  setsid sleep infinity < /dev/null > /dev/null 2>&1 &
  echo $! > "$dir/holder.pid"
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  local i h
  for i in $(seq 1 "$k"); do
    h=h$i
    ip netns add "$prefix$h"
    ip -n "$prefix$h" link set lo up
    # IPv4 only; a peer that stops acknowledging is given up after ~6 s of
    # retransmissions (default ~15 min), so that a cut link ends the job.
    ip netns exec "$prefix$h" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 \
      net.ipv4.tcp_retries2=3
    ip link add "$prefix$h" type veth peer name "${prefix}p$i"
    ip link set "$prefix$h" netns "$prefix$h"
    ip link set "${prefix}p$i" netns "$sw"
    ip -n "$prefix$h" link set "$prefix$h" name eth0
    ip -n "$sw" link set "${prefix}p$i" name "p$i"
    ip -n "$sw" link set "p$i" master br0 up
    ip -n "$prefix$h" addr add "$net.$i/24" dev eth0
    ip -n "$prefix$h" link set eth0 up
    touch "$dir/ns/$h.uts" "$dir/ns/$h.mnt"
    unshare --uts="$dir/ns/$h.uts" --mount="$dir/ns/$h.mnt" --propagation private \
      sh -c "hostname $h && mount -t tmpfs -o mode=1777 shm-$h /dev/shm && mount --bind '$dir/etc-hosts' /etc/hosts"
    echo "$h" >> "$dir/hosts.list"
    echo "$h slots=2" >> "$dir/hostfile"
  done
  # The rsh agent: "agent [-opts] HOST COMMAND..." runs COMMAND on HOST through a
  # shell, as ssh does (Open MPI and Hydra hand it one remote command line).
  cat > "$dir/agent" << EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case \$1 in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case \$host in $net.*) host=h\${host##*.} ;; esac
host=\${host%%.*}
[ -e "$dir/ns/\$host.uts" ] || { echo "mpiml cluster agent: no host '\$host'" >&2; exit 255; }
# From inside a host, the other hosts' namespace files are seen from the
# holder's mount namespace (the one the cluster was built in).
exec nsenter -t \$(cat "$dir/holder.pid") -m -- nsenter --net=/run/netns/$prefix\$host --uts="$dir/ns/\$host.uts" --mount="$dir/ns/\$host.mnt" -- sh -c "\$*"
EOF
  chmod +x "$dir/agent"
  # An mpirun for the cluster, for tools that take a launcher path.
  printf '#!/bin/sh\nexec "%s" run "$@"\n' "$(cd "$(dirname "$0")" && pwd)/$(basename "$0")" > "$dir/mpirun"
  chmod +x "$dir/mpirun"
  [ $slurm = 0 ] || slurm_up
  trap - EXIT
  echo "cluster: up, $k hosts ($(hosts | xargs)) on $net.0/24; hostfile $dir/hostfile, agent $dir/agent"
}

# The Slurm cluster (up --slurm): one munged (its own key and socket in
# $dir/slurm), slurmctld on h1, one slurmd per host started inside the host's
# namespaces, so that its steps and ranks run there. No cgroups
# (proctrack/linuxproc, task/none), no accounting; every file is under
# $dir/slurm. Each slurmd finds its node by its host name (UTS namespace) and
# listens on its own eth0, so all use the default ports.
slurm_pkgs=(slurmctld slurmd slurm-client munge slurm-wlm-basic-plugins)
slurm_env() {
  export SLURM_CONF=$dir/slurm/slurm.conf
  # Network settings a site would put in openmpi-mca-params.conf.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
  export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0 OMPI_MCA_osc=sm,ucx
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}
# Installs the Slurm packages that are missing (exit 77 if it cannot). The
# daemons this script starts use their own files only.
slurm_install() {
  local missing=() p
  for p in "${slurm_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  echo "cluster: installing ${missing[*]}"
  local out
  if ! out=$(DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" 2>&1); then
    tail -5 <<< "$out" >&2
    echo "cluster.sh: cannot build the Slurm cluster: cannot install ${missing[*]}" >&2
    exit 77
  fi
}
slurm_up() {
  local s=$dir/slurm h i
  mkdir -p "$s/munge" "$s/ctld"
  chmod 700 "$s/munge"
  head -c 1024 /dev/urandom > "$s/munge/munge.key"
  chmod 400 "$s/munge/munge.key"
  local nodes=()
  for h in $(hosts); do
    mkdir -p "$s/$h/tmp"
    nodes+=("NodeName=$h NodeAddr=$net.${h#h} NodeHostname=$h CPUs=2 State=UNKNOWN")
  done
  cat > "$s/slurm.conf" << EOF
ClusterName=mpiml
SlurmctldHost=h1($net.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$s/munge/munge.socket
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
StateSaveLocation=$s/ctld
SlurmctldPidFile=$s/ctld/slurmctld.pid
SlurmctldLogFile=$s/ctld/slurmctld.log
SlurmdSpoolDir=$s/%n
SlurmdPidFile=$s/%n/slurmd.pid
SlurmdLogFile=$s/%n/slurmd.log
# PMIx client directories (spmix_appdir_*) go to TmpFS: one per node (/tmp is shared)
TmpFS=$s/%n/tmp
# A node whose slurmd does not answer is DOWN after 10 s (default 300 s);
# steps get 5 s between SIGTERM and SIGKILL.
SlurmdTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=300
$(printf '%s\n' "${nodes[@]}")
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  enter h1 munged --force --socket="$s/munge/munge.socket" --key-file="$s/munge/munge.key" \
    --pid-file="$s/munge/munged.pid" --log-file="$s/munge/munged.log" --seed-file="$s/munge/munged.seed"
  SLURM_CONF=$s/slurm.conf enter h1 slurmctld
  for h in $(hosts); do SLURM_CONF=$s/slurm.conf enter "$h" slurmd; done
  # every node idle within 30 s
  local idle=0
  for i in $(seq 60); do
    idle=$(SLURM_CONF=$s/slurm.conf enter h1 sinfo -h -N -t idle -o %N 2> /dev/null | sort -u | wc -l)
    [ "$idle" -eq "$(nhosts)" ] && break
    sleep 0.5
  done
  if [ "$idle" -ne "$(nhosts)" ]; then
    SLURM_CONF=$s/slurm.conf enter h1 sinfo -N >&2 || true
    tail -5 "$s"/ctld/slurmctld.log "$s"/h*/slurmd.log >&2 || true
    die "slurm: $idle of $(nhosts) nodes idle after 30 s"
  fi
  echo "cluster: slurm up: slurmctld on h1, slurmd on $(hosts | xargs); SLURM_CONF=$s/slurm.conf"
}

cmd_slurmd() {  # HOST stop|start
  local h=$1 pid
  [ -e "$dir/slurm/slurm.conf" ] || die "slurmd: the Slurm cluster is not up (up --slurm)"
  case $2 in
    stop) pid=$(cat "$dir/slurm/$h/slurmd.pid" 2> /dev/null) && kill -9 "$pid" 2> /dev/null || true ;;
    start) SLURM_CONF=$dir/slurm/slurm.conf enter "$h" slurmd ;;
    *) die "slurmd HOST stop|start" ;;
  esac
}

# Launcher settings, as environment so that programs that re-launch themselves
# (mpi_fork) inherit them.
ompi_env() {
  export OMPI_MCA_plm_rsh_agent=$dir/agent
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader,tcp
  export OMPI_MCA_btl_tcp_if_include=eth0 OMPI_MCA_oob_tcp_if_include=eth0
  export OMPI_MCA_orte_default_hostfile=$dir/hostfile
  # Daemons notice a dead or unreachable peer within seconds (default: 300 s of
  # idle time first), so that a cut link ends the job on every host.
  export OMPI_MCA_oob_tcp_keepalive_time=2 OMPI_MCA_oob_tcp_keepalive_intvl=1 OMPI_MCA_oob_tcp_keepalive_probes=3
  export OMPI_MCA_rmaps_base_oversubscribe=1
  # One-sided MPI over TCP (osc ucx; Open MPI picks it by itself only on
  # InfiniBand/RoCE): the exit guard reads the ranks of other hosts with it.
  export OMPI_MCA_osc=sm,ucx
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export MPIML_HOSTFILE=$dir/hostfile
}

cmd_run() {
  [ -e "$dir/hosts.list" ] || die "run: the cluster is not up (scripts/cluster.sh up)"
  if [ "${MPIML_CLUSTER_MPI:-openmpi}" = mpich ]; then
    export HYDRA_LAUNCHER=rsh HYDRA_LAUNCHER_EXEC=$dir/agent HYDRA_IFACE=eth0
    export MPIML_HOSTFILE=$dir/hostfile MPIML_MPIRUN=mpiexec.mpich
    # Hydra's host list syntax is host:n, as Open MPI's --host.
    enter h1 mpiexec.mpich -launcher rsh -launcher-exec "$dir/agent" -iface eth0 "$@"
  else
    ompi_env
    enter h1 mpirun "$@"
  fi
}

cmd_ps() {
  local h
  for h in $(hosts); do
    local pids; pids=$(ip netns pids "$prefix$h" | xargs)
    echo "$h: ${pids:-(none)}"
    [ -z "$pids" ] || ps -o pid=,args= -p "${pids// /,}" | sed 's/^/    /'
  done
}

cmd_shape() {
  local h
  for h in $(hosts); do
    enter "$h" tc qdisc del dev eth0 root 2> /dev/null || true
    # shellcheck disable=SC2086
    [ -z "${1:-}" ] || enter "$h" tc qdisc add dev eth0 root $1
  done
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  run) shift; cmd_run "$@" ;;
  exec) shift; [ $# -ge 2 ] || die "exec HOST CMD..."; ompi_env; enter "$@" ;;
  slurm) shift; [ -e "$dir/slurm/slurm.conf" ] || die "slurm: the Slurm cluster is not up (up --slurm)"
    slurm_env; enter h1 "$@" ;;
  slurmd) [ $# -eq 3 ] || die "slurmd HOST stop|start"; cmd_slurmd "$2" "$3" ;;
  link) [ $# -eq 3 ] || die "link HOST up|down"; ip -n "$prefix$2" link set eth0 "$3" ;;
  shape) shift; cmd_shape "${1:-}" ;;
  ps) cmd_ps ;;
  check)
    why=$(why_not)
    if [ -n "$why" ]; then echo "cluster: cannot run here: $why"; exit 77; fi
    [ -e "$dir/hosts.list" ] || { echo "cluster: not up"; exit 1; }
    echo "cluster: up ($(hosts | xargs))" ;;
  hostfile) cat "$dir/hostfile" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
esac
