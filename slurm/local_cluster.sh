#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests and for trying the sbatch template:
#   eval "$(slurm/local_cluster.sh up DIR)"   # installs slurm+munge if missing, prints `export SLURM_CONF=...`
#   slurm/local_cluster.sh down DIR           # stops the daemons it started (by their pid files)
# Runs as root without systemd; every state, spool, socket, pid and log file lives in DIR.
set -euo pipefail

cmd=${1:?usage: local_cluster.sh up|down DIR}
dir=$(realpath -m "${2:?usage: local_cluster.sh up|down DIR}")

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
    && command -v munged >/dev/null && return
  [ "$(id -u)" = 0 ] || { echo "slurm is not installed and installing it needs root" >&2; exit 3; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >&2 || { echo "apt-get could not install slurm" >&2; exit 3; }
}

up() {
  install
  mkdir -p "$dir"/{state,spool,log,munge}
  chmod 700 "$dir/munge"
  [ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" >&2
  chmod 600 "$dir/munge/munge.key"
  munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed" \
    --force >&2
  local cpus
  cpus=$(nproc)
  cat > "$dir/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=$(hostname -s)(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF" >&2
  slurmd -f "$SLURM_CONF" -N localhost >&2
  for _ in $(seq 100); do
    if sinfo -h -o %T 2>/dev/null | grep -qx idle; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return
    fi
    sleep 0.2
  done
  echo "slurm did not come up; logs in $dir/log" >&2
  down
  exit 1
}

down() {
  if [ -f "$dir/slurmctld.pid" ]; then
    # Jobs first: a step whose controller is gone leaves srun and slurmstepd waiting forever.
    export SLURM_CONF=$dir/slurm.conf
    squeue -h -o %i 2>/dev/null | xargs -r scancel 2>/dev/null || true
    for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  for pidfile in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "$pidfile"
  done
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

case $cmd in
  up) up ;;
  down) down ;;
  *) echo "usage: local_cluster.sh up|down DIR" >&2; exit 2 ;;
esac
