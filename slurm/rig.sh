#!/usr/bin/env bash
# Two nodes on this machine, to rehearse a multi-node run (torchrun, srun, sbatch) before a cluster:
#   slurm/rig.sh up DIR [--node-local] [--slurm]   # as root; --slurm (installs slurm+munge if missing)
#                                                 # prints `export SLURM_CONF=...`
#   slurm/rig.sh on DIR a|b CMD [ARG...]          # run CMD on node a or b, in the current directory
#   slurm/rig.sh runs DIR shared|node-local       # switch DIR/runs while the rig is up
#   slurm/rig.sh down DIR                          # stop what `up` started, by its pids and namespaces
#   slurm/rig.sh install                           # as root: slurm and munge from Debian, where missing
#
# Each node is a network namespace (ip netns) with a UTS and a mount namespace of its own:
# - hostname rig-a / rig-b; address 10.250.0.1 / 10.250.0.2 on interface rig0, a veth pair that joins
#   the two and nothing else (no route out: every packet stays between the nodes or on their own lo);
# - an /etc/hosts that names the other node by its address but maps its own name to 127.0.1.1, as
#   Debian's does: whatever binds "the hostname's address" (gloo without GLOO_SOCKET_IFNAME) gets
#   loopback, as on many real nodes;
# - a private /tmp and /dev/shm. DIR and this repo stay visible at their own paths on both nodes
#   (also under /tmp).
# DIR/runs is where runs go: shared, both nodes see DIR/shared there (a shared filesystem);
# node-local (--node-local, or `runs DIR node-local`), node a sees DIR/a/runs and node b DIR/b/runs.
# --slurm: munged and slurmctld on node a, a slurmd on each node (own NodeName, NodeAddr, spool, log),
# TaskPlugin=task/affinity, so that srun binds each task to the CPUs SLURM gave it. Each node offers
# the CPUs this machine lets the script use: the two nodes' tasks share the cores, each bound as a
# cluster would bind it. Clients run on a node: `rig.sh on DIR a sbatch ...`.
set -euo pipefail

usage="usage: rig.sh up DIR [--node-local] [--slurm] | on DIR a|b CMD... | runs DIR shared|node-local | down DIR | install"
cmd=${1:?$usage}

on() {  # on NODE CMD...: CMD in the node's network, hostname and mounts; in this directory
  local node=$1 holder
  shift
  read -r holder < "$dir/$node/holder.pid"
  exec nsenter --target "$holder" --net --uts --mount --wd="$PWD" -- "$@"
}

# `on` first: what follows starts processes of its own (realpath, dirname, md5sum), and tests poll
# SLURM through `on`.
if [ "$cmd" = on ]; then
  dir=${2:?$usage}
  shift 2
  on "$@"
fi

dir=""
[ "$cmd" = install ] || dir=$(realpath -m "${2:?$usage}")
self=$(realpath "$0")
source "$(dirname "$self")/../scripts/debian_packages.sh"
repo=$(dirname "$(dirname "$self")")
# One rig per DIR: its namespaces are named after it, so that rigs of parallel tests never meet.
ns=rig$(printf %s "$dir" | md5sum | cut -c1-8)
declare -A address=([a]=10.250.0.1 [b]=10.250.0.2)

hold() {  # run inside `unshare` in the node's netns: set the node up, then hold its namespaces
  local node=$1
  hostname "rig-$node"
  ip link set lo up
  ip addr add "${address[$node]}/24" dev rig0
  ip link set rig0 up
  local other
  other=$([ "$node" = a ] && echo b || echo a)
  printf '127.0.0.1 localhost\n127.0.1.1 rig-%s\n%s rig-%s\n' "$node" "${address[$other]}" "$other" > "$dir/$node/hosts"
  mount --bind "$dir/$node/hosts" /etc/hosts
  mount -t tmpfs -o size=256m,mode=1777 "$ns-$node-shm" /dev/shm
  # The node's /tmp is DIR/<node>/tmp. DIR, and the repo whose code the nodes run (on a cluster, a
  # shared filesystem holds it), if under /tmp, are bound back in at their own paths.
  local kept
  for kept in "$dir" "$repo"; do
    if [[ $kept == /tmp/* ]]; then
      mkdir -p "$dir/$node/tmp/${kept#/tmp/}"
      mount --bind "$kept" "$dir/$node/tmp/${kept#/tmp/}"
    fi
  done
  mount --rbind "$dir/$node/tmp" /tmp
  mount_runs "$node" "$(cat "$dir/runs.mode")"
  echo $$ > "$dir/$node/holder.pid.tmp"
  mv "$dir/$node/holder.pid.tmp" "$dir/$node/holder.pid"
  exec sleep infinity
}

mount_runs() {  # in the node's mount namespace
  local node=$1 mode=$2
  mountpoint -q "$dir/runs" && umount "$dir/runs"
  if [ "$mode" = shared ]; then
    mount --bind "$dir/shared" "$dir/runs"
  else
    mount --bind "$dir/$node/runs" "$dir/runs"
  fi
}

up() {
  [ "$(id -u)" = 0 ] || { echo "the rig needs root (network and mount namespaces)" >&2; exit 3; }
  local mode=shared slurm=0
  for opt in "$@"; do
    case $opt in
      --node-local) mode=node-local ;;
      --slurm) slurm=1 ;;
      *) echo "$usage" >&2; exit 2 ;;
    esac
  done
  if ip netns pids "$ns-a" >/dev/null 2>&1; then
    echo "a rig is up in $dir already: slurm/rig.sh down $dir first" >&2
    exit 1
  fi
  mkdir -p "$dir"/{runs,shared} "$dir"/{a,b}/{tmp,runs}
  echo "$mode" > "$dir/runs.mode"
  ip netns add "$ns-a"
  ip netns add "$ns-b"
  ip link add name rig0 netns "$ns-a" type veth peer name rig0 netns "$ns-b"
  for node in a b; do
    # nsenter, not `ip netns exec`, which mounts a sysfs of the netns's own over /sys (and so hides
    # /sys/fs/cgroup, which slurmd needs).
    nsenter --net="/run/netns/$ns-$node" unshare --uts --mount --propagation private \
      bash "$self" _hold "$dir" "$node" > "$dir/$node/holder.log" 2>&1 &
  done
  for node in a b; do
    for _ in $(seq 100); do [ -f "$dir/$node/holder.pid" ] && break; sleep 0.05; done
    [ -f "$dir/$node/holder.pid" ] || { echo "node $node did not come up: $(cat "$dir/$node/holder.log")" >&2; down; exit 1; }
  done
  [ "$slurm" = 1 ] && slurm_up
  return 0
}

installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
    && command -v munged >/dev/null
}

install() {  # SLURM and munge from Debian's packages, where missing; `fail` runs if that fails
  local fail=${1:-true}
  debian_install "${RIG_INSTALL_LOCK:-/run/lock/slurm-rig-install.lock}" installed \
    slurmctld slurmd slurm-client munge || { echo "apt-get could not install slurm" >&2; "$fail"; exit 3; }
}

slurm_up() {
  install down
  local s=$dir/slurm cpus
  mkdir -p "$s"/{state,munge,rig-a,rig-b}
  chmod 700 "$s/munge"
  [ -f "$s/munge/munge.key" ] || mungekey --create --keyfile="$s/munge/munge.key" >&2
  chmod 600 "$s/munge/munge.key"
  # nproc obeys OMP_NUM_THREADS; the node has the CPUs it may run on.
  cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
  # Each node has a network of its own, so the default ports are free on every rig.
  cat > "$s/slurm.conf" <<CONF
ClusterName=rig
SlurmctldHost=rig-a(${address[a]})
AuthType=auth/munge
AuthInfo=socket=$s/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
SlurmdSpoolDir=$s/%n/spool
SlurmctldPidFile=$s/slurmctld.pid
SlurmdPidFile=$s/%n/slurmd.pid
SlurmctldLogFile=$s/slurmctld.log
SlurmdLogFile=$s/%n/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SchedulerType=sched/backfill
# A requeued job is held to its begin time, then started by a scheduler pass: every second, not 30-60.
SchedulerParameters=bf_interval=1,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
NodeName=rig-a NodeAddr=${address[a]} CPUs=$cpus State=UNKNOWN
NodeName=rig-b NodeAddr=${address[b]} CPUs=$cpus State=UNKNOWN
PartitionName=rig Nodes=rig-a,rig-b Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$s/slurm.conf
  (on a munged --key-file="$s/munge/munge.key" --socket="$s/munge/munge.socket" --pid-file="$s/munge/munged.pid" \
    --log-file="$s/munge/munged.log" --seed-file="$s/munge/munge.seed" --force) >&2
  (on a slurmctld -f "$SLURM_CONF") >&2
  for node in a b; do
    mkdir -p "$s/rig-$node/spool"
    (on "$node" slurmd -f "$SLURM_CONF" -N "rig-$node") >&2
  done
  for _ in $(seq 150); do
    if [ "$( (on a sinfo -h -o %T) 2>/dev/null | sort -u)" = idle ]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return
    fi
    sleep 0.2
  done
  echo "slurm did not come up; logs in $s" >&2
  down
  exit 1
}

down() {
  local s=$dir/slurm
  if [ -f "$s/slurmctld.pid" ] && [ -f "$dir/a/holder.pid" ]; then
    # Jobs first: a step whose controller is gone leaves srun and slurmstepd waiting forever.
    export SLURM_CONF=$s/slurm.conf
    (on a bash -c 'squeue -h -o %i | xargs -r scancel') 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$( (on a squeue -h) 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for pidfile in "$s"/rig-{a,b}/slurmd.pid "$s/slurmctld.pid" "$s/munge/munged.pid"; do
    [ -f "$pidfile" ] || continue
    stop "$(cat "$pidfile")"
    rm -f "$pidfile"
  done
  # Whatever still runs in the rig's network namespaces was started in them (the holders, a
  # torchrun, a job's tasks): ended by pid, then the namespaces go, and with them rig0.
  for node in a b; do
    if ip netns pids "$ns-$node" >/dev/null 2>&1; then
      for pid in $(ip netns pids "$ns-$node"); do stop "$pid"; done
      ip netns del "$ns-$node"
    fi
    rm -f "$dir/$node/holder.pid"
  done
}

stop() {  # SIGTERM, then SIGKILL after 1 s: the rig keeps no state worth slurmctld's slow exit
  local pid=$1
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 10); do running "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

running() {  # a zombie has ended: whoever adopted the daemons may reap it late
  local state
  state=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) && [ "$state" != Z ]
}

case $cmd in
  up) shift 2; up "$@" ;;
  runs)
    mode=${3:?$usage}
    echo "$mode" > "$dir/runs.mode"
    for node in a b; do (on "$node" bash "$self" _runs "$dir" "$node" "$mode"); done ;;
  _runs) mount_runs "$3" "$4" ;;
  _hold) hold "$3" ;;
  down) down ;;
  install) install ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
