#!/usr/bin/env bash
# Start (or stop) the services the server tests need: a throwaway PostgreSQL and a throwaway Redis (the
# Celery broker), both on 127.0.0.1 on free ports.
#   source scripts/services.sh && services_start   # exports PARITY_TEST_POSTGRES_URL, PARITY_TEST_REDIS_URL
#   services_stop                                   # stops them and removes their data directories
# services_start starts every service it can and fails (non-zero) when any one could not start.
# PostgreSQL comes from Debian's `postgresql` package, installed only when its binaries are missing. The
# cluster runs as an unprivileged user (initdb and postgres refuse to run as root).
# Redis comes from Debian's `redis-server` package, installed only when `redis-server` is missing; it keeps
# nothing on disk (no RDB snapshots, no AOF).

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
  local rc=0
  _pg_start || { echo "services: PostgreSQL did not start" >&2; rc=1; }
  _redis_start || { echo "services: Redis did not start" >&2; rc=1; }
  return $rc
}

_pg_start() {
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

_redis_start() {
  local bin i
  bin="$(command -v redis-server || true)"
  if [ -z "$bin" ]; then
    echo "services: redis-server missing; installing Debian's redis-server package" >&2
    if [ "$(id -u)" -ne 0 ]; then echo "services: need root to apt-get install redis-server" >&2; return 1; fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >&2
    # The package may start its own daemon on 6379; the tests use theirs, so that one is stopped again.
    invoke-rc.d redis-server stop >/dev/null 2>&1 || true
    bin="$(command -v redis-server || true)"
    [ -n "$bin" ] || { echo "services: redis-server installed but not on PATH" >&2; return 1; }
  fi
  PARITY_REDIS_DIR="$(mktemp -d /tmp/parity-redis.XXXXXX)"
  PARITY_REDIS_PORT="$(_free_port)"
  export PARITY_REDIS_DIR PARITY_REDIS_PORT
  "$bin" --bind 127.0.0.1 --port "$PARITY_REDIS_PORT" --save "" --appendonly no --dir "$PARITY_REDIS_DIR" \
    --daemonize yes --pidfile "$PARITY_REDIS_DIR/redis.pid" --logfile "$PARITY_REDIS_DIR/redis.log" >&2 \
    || { cat "$PARITY_REDIS_DIR/redis.log" >&2 2>/dev/null; return 1; }
  # --daemonize returns before the port is open: wait (up to 30 s) for an answer to PING.
  for i in $(seq 1 300); do
    if _redis_ping "$PARITY_REDIS_PORT"; then
      export PARITY_TEST_REDIS_URL="redis://127.0.0.1:$PARITY_REDIS_PORT/0"
      echo "services: Redis ($bin) on 127.0.0.1:$PARITY_REDIS_PORT" >&2
      return 0
    fi
    sleep 0.1
  done
  cat "$PARITY_REDIS_DIR/redis.log" >&2 2>/dev/null
  return 1
}

_redis_ping() {
  python3 - "$1" <<'PY' 2>/dev/null
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
    s.sendall(b"PING\r\n")
    sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
PY
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
  if [ -n "${PARITY_REDIS_DIR:-}" ] && [ -d "$PARITY_REDIS_DIR" ]; then
    local pid i
    pid="$(cat "$PARITY_REDIS_DIR/redis.pid" 2>/dev/null || true)"
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    fi
    rm -rf "$PARITY_REDIS_DIR"
  fi
}
