#!/bin/bash
# The official postgres image's entrypoint, in short: as root, own the data and socket directories and run as the
# postgres user; on an empty data directory, initdb with POSTGRES_USER / POSTGRES_PASSWORD and create POSTGRES_DB
# (the temporary server listens on a private socket only, so no healthcheck sees it as ready); then run the command.
set -Eeuo pipefail
if [ "${1:0:1}" = - ]; then
    set -- postgres "$@"
fi
if [ "$1" = postgres ] && [ "$(id -u)" = 0 ]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown -R postgres:postgres "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    exec gosu postgres "${BASH_SOURCE[0]}" "$@"
fi
if [ "$1" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?the postgres stand-in needs POSTGRES_PASSWORD, as the official image does}"
    user="${POSTGRES_USER:-postgres}"
    db="${POSTGRES_DB:-$user}"
    initdb --username="$user" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD") -D "$PGDATA" ${POSTGRES_INITDB_ARGS:-}
    printf '\nhost all all all %s\n' "${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}" >> "$PGDATA/pg_hba.conf"
    init_socket="$(mktemp -d)"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses='' -c unix_socket_directories=$init_socket" -w start
    if [ "$db" != postgres ]; then
        psql -v ON_ERROR_STOP=1 -h "$init_socket" --username "$user" --dbname postgres -c "CREATE DATABASE \"$db\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w stop
    rmdir "$init_socket"
fi
exec "$@"
