#!/bin/sh
# As the official redis image's entrypoint: `redis-server ...` runs as the redis user in /data with protected mode
# off (the official image builds Redis with it off; Debian's is on, which refuses clients from other containers).
set -e
if [ "${1#-}" != "$1" ] || [ "${1%.conf}" != "$1" ]; then
    set -- redis-server "$@"
fi
if [ "$1" = "redis-server" ]; then
    shift
    if [ "$(id -u)" = "0" ]; then
        chown -R redis:redis /data 2>/dev/null || true
        case "$1" in
            ""|-*) exec setpriv --reuid=redis --regid=redis --init-groups redis-server --protected-mode no "$@" ;;
            *) conf="$1"; shift; exec setpriv --reuid=redis --regid=redis --init-groups redis-server "$conf" --protected-mode no "$@" ;;
        esac
    fi
    exec redis-server --protected-mode no "$@"
fi
exec "$@"
