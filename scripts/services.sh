#!/usr/bin/env bash
# Start (or stop) the services the server tests need: a throwaway PostgreSQL on 127.0.0.1.
#   source scripts/services.sh && services_start   # exports PARITY_TEST_POSTGRES_URL
#   services_stop                                   # stops it and removes its data directory
# PostgreSQL comes from Debian's `postgresql` package, installed only when its binaries are missing. The
# cluster runs as an unprivileged user (initdb and postgres refuse to run as root).

_pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    if [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then echo "$d"; fi
  done | sort -V | tail -n 1
}

_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

services_start() {
  local bindir pg_user
  bindir="$(_pg_bindir)"
  if [ -z "$bindir" ]; then
    echo "services: PostgreSQL binaries missing; installing Debian's postgresql package" >&2
    if [ "$(id -u)" -ne 0 ]; then echo "services: need root to apt-get install postgresql" >&2; return 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    bindir="$(_pg_bindir)"
    [ -n "$bindir" ] || { echo "services: postgresql installed but no server binaries found" >&2; return 1; }
  fi
  PARITY_PG_DIR="$(mktemp -d /tmp/parity-pg.XXXXXX)"
  PARITY_PG_PORT="$(_free_port)"
  export PARITY_PG_DIR PARITY_PG_PORT PARITY_PG_BINDIR="$bindir"
  if [ "$(id -u)" -eq 0 ]; then
    pg_user=postgres
    id -u "$pg_user" >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin "$pg_user"
    chown "$pg_user" "$PARITY_PG_DIR"
    _as_pg() { runuser -u postgres -- "$@"; }
  else
    pg_user="$(id -un)"
    _as_pg() { "$@"; }
  fi
  _as_pg "$bindir/initdb" -D "$PARITY_PG_DIR/data" -U parity --auth=trust -E UTF8 >"$PARITY_PG_DIR/initdb.log" 2>&1 \
    || { cat "$PARITY_PG_DIR/initdb.log" >&2; return 1; }
  _as_pg "$bindir/pg_ctl" -D "$PARITY_PG_DIR/data" -l "$PARITY_PG_DIR/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PARITY_PG_PORT -k $PARITY_PG_DIR -c fsync=off -c max_connections=300" \
    start >&2 || { cat "$PARITY_PG_DIR/server.log" >&2; return 1; }
  export PARITY_TEST_POSTGRES_URL="postgresql+psycopg://parity@127.0.0.1:$PARITY_PG_PORT/postgres"
  echo "services: PostgreSQL ($bindir) on 127.0.0.1:$PARITY_PG_PORT" >&2
}

services_stop() {
  if [ -n "${PARITY_PG_DIR:-}" ] && [ -d "$PARITY_PG_DIR/data" ]; then
    if [ "$(id -u)" -eq 0 ]; then
      runuser -u postgres -- "$PARITY_PG_BINDIR/pg_ctl" -D "$PARITY_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    else
      "$PARITY_PG_BINDIR/pg_ctl" -D "$PARITY_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PARITY_PG_DIR"
  fi
}
