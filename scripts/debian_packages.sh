# Sourced by slurm/rig.sh and scripts/postgres.sh: Debian's packages, installed once however many
# callers start at once. Test modules that each bring up a rig or a server would each run apt-get,
# and all but one would fail on dpkg's lock: they take LOCK in turn, and each asks again once it
# holds it.
#
#   debian_install LOCK CHECK PACKAGE...
#
# CHECK: a command (one of the caller's functions) that succeeds once what the packages give is
# there. Returns 1 if apt-get fails.
debian_install() {
  local lock_file=$1 check=$2 lock
  shift 2
  "$check" >/dev/null && return 0
  mkdir -p "$(dirname "$lock_file")"
  exec {lock}>"$lock_file"
  flock "$lock"
  if ! "$check" >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    # The lock timeout: an apt-get of something else (unattended upgrades) is waited for too.
    if ! { apt-get -o DPkg::Lock::Timeout=300 update -qq >&2 \
      && apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$@" >&2; }; then
      exec {lock}>&-
      return 1
    fi
  fi
  exec {lock}>&-
}
