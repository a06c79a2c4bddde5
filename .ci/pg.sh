#!/usr/bin/env bash
# A private PostgreSQL server on loopback for the tests and benchmarks, one per checkout.
#
#   bash .ci/pg.sh start   # installs Debian's postgresql if missing, starts this checkout's server
#   bash .ci/pg.sh stop    # stops it (the data folder stays, for the next start)
#   bash .ci/pg.sh status  # exit 0 when it runs
#   bash .ci/pg.sh url     # prints the admin URL the tests read from LOOP_ACTORS_TEST_PG
#   bash .ci/pg.sh owner   # the pid of the live process that started it to stop it at its end
#
# Each checkout has a server of its own, so that two test runs on one machine (the
# checkouts of two people, or two worktrees) never share one, and the first to finish
# never stops the other's: its folder is LOOP_ACTORS_PG_ROOT (default
# /tmp/loop-actors-pg-NAME-HASH, NAME the checkout's folder name, HASH 8 hex digits of
# the SHA-256 of its path) and its port LOOP_ACTORS_PG_PORT (default: one of 55500-55899
# picked by the same hash, or the next free one if that is taken, chosen at the first
# start and kept in the folder's `port` file). A port given in LOOP_ACTORS_PG_PORT that
# another server holds is refused. A `start` with LOOP_ACTORS_PG_STOP_AT_EXIT=1 (as
# .ci/test starts it: it stops the server when it ends) records the calling process in
# the folder's `owner` file, and .ci/test refuses to run on a server that another live
# test run started so: that run would stop it under this one.
#
# Run as root (initdb and the server run as the postgres user) or as an ordinary user
# who may create the folder (they run as that user).
set -euo pipefail
CHECKOUT=$(cd "$(dirname "$0")/.." && pwd -P)
HASH=$(printf '%s' "$CHECKOUT" | sha256sum | cut -c1-8)
PG_ROOT=${LOOP_ACTORS_PG_ROOT:-/tmp/loop-actors-pg-$(basename "$CHECKOUT")-$HASH}
DATA=$PG_ROOT/data
PORT_FILE=$PG_ROOT/port
OWNER_FILE=$PG_ROOT/owner
FIRST_PORT=55500
PORTS=400

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_owner() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
running() {
    local pgbin
    pgbin=$(pg_bin)
    [ -n "$pgbin" ] && [ -f "$DATA/PG_VERSION" ] && as_owner "$pgbin/pg_ctl" -D "$DATA" status >/dev/null 2>&1
}
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
preferred_port() { echo $((FIRST_PORT + 16#$HASH % PORTS)); }
port() {
    # The port this folder's server uses, or would use at its next start.
    if [ -n "${LOOP_ACTORS_PG_PORT:-}" ]; then
        echo "$LOOP_ACTORS_PG_PORT"
    elif [ -s "$PORT_FILE" ]; then
        cat "$PORT_FILE"
    else
        preferred_port
    fi
}
free_port() {
    # The port to start on: this folder's, else the next free one of the range.
    local wanted candidate i
    wanted=$(port)
    if ! listening "$wanted"; then
        echo "$wanted"
        return
    fi
    if [ -n "${LOOP_ACTORS_PG_PORT:-}" ]; then
        echo "port $wanted (LOOP_ACTORS_PG_PORT) is taken by another server; $PG_ROOT's" \
            "server cannot start there: choose another port, or unset it for a free one" >&2
        return 1
    fi
    for ((i = 1; i < PORTS; i++)); do
        candidate=$((FIRST_PORT + (wanted - FIRST_PORT + i) % PORTS))
        if ! listening "$candidate"; then
            echo "$candidate"
            return
        fi
    done
    echo "no free port in $FIRST_PORT-$((FIRST_PORT + PORTS - 1)) for $PG_ROOT's server" >&2
    return 1
}
write_file() {
    # write_file FILE TEXT: as the folder's owner (postgres when run as root).
    if [ "$(id -u)" = 0 ]; then
        printf '%s\n' "$2" | runuser -u postgres -- tee "$1" >/dev/null
    else
        printf '%s\n' "$2" >"$1"
    fi
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
    if ! running; then
        PG_PORT=$(free_port)
        write_file "$PORT_FILE" "$PG_PORT"
        as_owner "$PGBIN/pg_ctl" -D "$DATA" -l "$PG_ROOT/log/server.log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_ROOT/sock -c max_connections=400 -c fsync=on -c synchronous_commit=on" \
            start >/dev/null
        if [ "${LOOP_ACTORS_PG_STOP_AT_EXIT:-}" = 1 ]; then
            write_file "$OWNER_FILE" "$PPID"
        fi
    fi
    echo "PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$(port) (data $DATA)" >&2
    ;;
stop)
    PGBIN=$(pg_bin)
    if [ -n "$PGBIN" ] && [ -f "$DATA/PG_VERSION" ]; then
        as_owner "$PGBIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
    rm -f "$OWNER_FILE"
    ;;
status)
    running
    ;;
owner)
    if running && [ -s "$OWNER_FILE" ] && kill -0 "$(cat "$OWNER_FILE")" 2>/dev/null; then
        cat "$OWNER_FILE"
    fi
    ;;
url)
    echo "postgresql://postgres:postgres@127.0.0.1:$(port)/postgres"
    ;;
*)
    echo "usage: $0 start|stop|status|url|owner" >&2
    exit 2
    ;;
esac
