#!/bin/bash
# What the compose file uses of the official postgres image's entrypoint: on first start (an empty PGDATA) initdb
# with POSTGRES_USER (default postgres) and POSTGRES_PASSWORD (required), scram-sha-256 for every host, then
# POSTGRES_DB created by a temporary server listening on the Unix socket only; then `postgres` as the postgres user,
# listening on every interface. Scripts in /docker-entrypoint-initdb.d are not run (the compose file has none).
set -euo pipefail
if [ "${1:0:1}" = "-" ]; then
    set -- postgres "$@"
fi
if [ "$1" != "postgres" ]; then
    exec "$@"
fi
if [ "$(id -u)" = "0" ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi
user="${POSTGRES_USER:-postgres}"
db="${POSTGRES_DB:-$user}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "Error: Database is uninitialized and superuser password is not specified (set POSTGRES_PASSWORD)." >&2
        exit 1
    fi
    initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") --auth-local=trust \
        --auth-host=scram-sha-256 -D "$PGDATA" >/dev/null
    printf 'host all all all scram-sha-256\n' >> "$PGDATA/pg_hba.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -k /var/run/postgresql" -w start >/dev/null
    if [ "$db" != "postgres" ]; then
        psql -v ON_ERROR_STOP=1 -h /var/run/postgresql -U "$user" -d postgres -q \
            -c "CREATE DATABASE \"$db\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    echo "PostgreSQL init process complete; ready for start up."
fi
exec postgres -c listen_addresses='*' -k /var/run/postgresql "${@:2}"
