#!/usr/bin/env bash
# A PostgreSQL server of its own for a search's study (hydra.sweeper.storage), on this machine:
#   scripts/postgres.sh up DIR       # as root: a cluster in DIR/cluster, run as the postgres user,
#                                    # on 127.0.0.1 and a free port; prints what to export:
#                                    #   export PGPASSFILE=DIR/pgpass
#                                    #   export STUDY_STORAGE=postgresql+psycopg://optuna@127.0.0.1:PORT/optuna
#   scripts/postgres.sh down DIR     # stop the server `up` started in DIR, by its pid
#   scripts/postgres.sh install      # as root: Debian's postgresql, where missing
#
# The password is random, in DIR/pgpass (mode 600) only: the URL holds none (Hydra writes the URL to
# .hydra/ and the log), and libpq reads it from PGPASSFILE. `up` again on DIR starts the same cluster
# (its data kept) if it is down, and prints the same lines. postgres refuses to run as root, and runs
# as the postgres user that Debian's package makes: DIR must be one it can reach (not under a private
# directory such as pytest's /tmp/pytest-of-root).
set -euo pipefail

usage="usage: postgres.sh up DIR | down DIR | install"
cmd=${1:?$usage}
dir=""
[ "$cmd" = install ] || dir=$(realpath -m "${2:?$usage}")
user=optuna
database=optuna
# Debian keeps each major version's programs in /usr/lib/postgresql/<version>/bin, off the PATH.
lib=${POSTGRES_LIB:-/usr/lib/postgresql}
source "$(dirname "$(realpath "$0")")/debian_packages.sh"

bindir() {  # the newest installed version's programs, or nothing
  local found
  found=$(ls -d "$lib"/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$found" ] && [ -x "$found/pg_ctl" ] && [ -x "$found/initdb" ] && [ -x "$found/createdb" ] && echo "$found"
}

install() {
  [ -n "$(bindir)" ] && return
  [ "$(id -u)" = 0 ] || { echo "postgres.sh: installing postgresql needs root" >&2; exit 3; }
  debian_install "${POSTGRES_INSTALL_LOCK:-/run/lock/postgres-install.lock}" bindir postgresql \
    || { echo "postgres.sh: apt-get could not install postgresql" >&2; exit 3; }
}

as_postgres() { runuser -u postgres -- "$@"; }

pid() {  # the server's pid while it runs: postmaster.pid's first line, if that process lives
  local p
  p=$(head -n 1 "$dir/cluster/data/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$p" ] && running "$p" && echo "$p"
}

running() {  # a zombie has ended: whoever adopted the server (pg_ctl leaves it) may reap it late
  local state
  state=$(sed 's/.*) \(.\).*/\1/' "/proc/$1/stat" 2>/dev/null) && [ "$state" != Z ]
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

say() {
  echo "export PGPASSFILE=$dir/pgpass"
  echo "export STUDY_STORAGE=postgresql+psycopg://$user@127.0.0.1:$(cat "$dir/port")/$database"
}

up() {
  [ "$(id -u)" = 0 ] || { echo "postgres.sh: up needs root (the server runs as the postgres user)" >&2; exit 3; }
  install
  local bin
  bin=$(bindir)
  mkdir -p "$dir/cluster"
  chown postgres: "$dir/cluster"
  chmod 700 "$dir/cluster"
  if ! as_postgres test -w "$dir/cluster"; then
    echo "postgres.sh: the postgres user cannot reach $dir (a directory above it is private);" \
      "choose a DIR it can reach, e.g. under /var/tmp" >&2
    exit 1
  fi
  if pid > /dev/null; then
    say
    return
  fi
  if [ ! -f "$dir/cluster/data/PG_VERSION" ]; then
    local password
    password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
    # Given to initdb through a file the postgres user reads, then removed: never on a command line.
    (umask 077 && echo "$password" > "$dir/cluster/password")
    chown postgres: "$dir/cluster/password"
    as_postgres "$bin/initdb" -D "$dir/cluster/data" -U "$user" --pwfile="$dir/cluster/password" \
      --auth=scram-sha-256 -E UTF8 > "$dir/initdb.log" 2>&1 \
      || { echo "postgres.sh: initdb failed; its log: $dir/initdb.log" >&2; rm -f "$dir/cluster/password"; exit 1; }
    rm -f "$dir/cluster/password"
    free_port > "$dir/port"
    (umask 077 && echo "127.0.0.1:$(cat "$dir/port"):*:$user:$password" > "$dir/pgpass")
  fi
  local port
  port=$(cat "$dir/port")
  # 127.0.0.1 only, and no Unix socket: nothing but this machine's TCP clients, each with the password.
  # Each trial's process and each sweeper holds a connection or two: PostgreSQL's default max_connections
  # (100) turns a search with many trials at once away ("too many clients").
  as_postgres "$bin/pg_ctl" -D "$dir/cluster/data" -l "$dir/cluster/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories='' -c max_connections=400" \
    start > /dev/null \
    || { echo "postgres.sh: the server did not start; its log: $dir/cluster/postgres.log" >&2; exit 1; }
  if [ ! -f "$dir/cluster/created" ]; then
    PGPASSFILE="$dir/pgpass" "$bin/createdb" -h 127.0.0.1 -p "$port" -U "$user" "$database" \
      || { echo "postgres.sh: could not create database $database" >&2; down; exit 1; }
    touch "$dir/cluster/created"
  fi
  say
}

down() {  # the server's fast shutdown (SIGINT), then SIGQUIT, then SIGKILL, each after 10 s
  local p
  p=$(pid) || return 0
  for sig in INT QUIT KILL; do
    kill -s "$sig" "$p" 2>/dev/null || return 0
    for _ in $(seq 100); do running "$p" || return 0; sleep 0.1; done
  done
}

case $cmd in
  up) up ;;
  down) down ;;
  install) install ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
