#!/usr/bin/env bash
# A private PostgreSQL server on loopback for the tests and benchmarks.
#
#   bash .ci/pg.sh start   # installs Debian's postgresql if missing, starts the server
#   bash .ci/pg.sh stop    # stops it (the data folder stays, for the next start)
#   bash .ci/pg.sh status  # exit 0 when the server runs
#   bash .ci/pg.sh url     # prints the admin URL the tests read from LOOP_ACTORS_TEST_PG
#
# Environment: LOOP_ACTORS_PG_ROOT (default /tmp/loop-actors-pg), LOOP_ACTORS_PG_PORT
# (default 55433). Run as root (initdb and the server run as the postgres user) or as
# an ordinary user who owns LOOP_ACTORS_PG_ROOT (they run as that user).
set -euo pipefail
PG_ROOT=${LOOP_ACTORS_PG_ROOT:-/tmp/loop-actors-pg}
PG_PORT=${LOOP_ACTORS_PG_PORT:-55433}
DATA=$PG_ROOT/data

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    PGBIN=$(pg_bin)
    if [ -z "$PGBIN" ] || ! [ -x "$PGBIN/initdb" ]; then
        if [ "$(id -u)" != 0 ]; then
            echo "PostgreSQL is not installed and this user cannot install it (apt-get install postgresql)" >&2
            exit 1
        fi
        echo "installing PostgreSQL (Debian package postgresql)" >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        PGBIN=$(pg_bin)
    fi
    if [ "$(id -u)" = 0 ]; then
        install -d -o postgres -g postgres "$PG_ROOT" "$PG_ROOT/sock" "$PG_ROOT/log"
    else
        mkdir -p "$PG_ROOT/sock" "$PG_ROOT/log"
    fi
    if ! [ -f "$DATA/PG_VERSION" ]; then
        as_owner "$PGBIN/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 \
            >"$PG_ROOT/log/initdb.log"
    fi
    if ! as_owner "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_owner "$PGBIN/pg_ctl" -D "$DATA" -l "$PG_ROOT/log/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_ROOT/sock -c max_connections=400 -c fsync=on -c synchronous_commit=on" \
            start >/dev/null
    fi
    echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT (data $DATA)" >&2
    ;;
stop)
    PGBIN=$(pg_bin)
    if [ -n "$PGBIN" ] && [ -f "$DATA/PG_VERSION" ]; then
        as_owner "$PGBIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    ;;
status)
    PGBIN=$(pg_bin)
    [ -n "$PGBIN" ] && [ -f "$DATA/PG_VERSION" ] && as_owner "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1
    ;;
url)
    echo "postgresql://postgres:postgres@127.0.0.1:$PG_PORT/postgres"
    ;;
*)
    echo "usage: $0 start|stop|status|url" >&2
    exit 2
    ;;
esac
