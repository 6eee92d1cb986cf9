#!/usr/bin/env bash
# Install redis-server, and start or stop a private one on a loopback port (for seqkv.store).
#
#   scripts/redis.sh install              apt-get install redis-server (Debian 12: Redis 7.0) if missing
#   scripts/redis.sh start PORT DIR       start one on 127.0.0.1:PORT, data and append-only file in DIR
#                                         (appendfsync always: a write is on disk before its reply)
#   scripts/redis.sh stop DIR             stop the one started with DIR (SIGTERM, then wait)
#   scripts/redis.sh status DIR           exit 0 if it answers PING
#
# The tests do not need this script: they start their own server on a free port
# (seqkv.store.redis_server.RedisServer); they need redis-server installed, and fail without it.
set -euo pipefail

die() { echo "redis.sh: $*" >&2; exit 2; }

install() {
    if command -v redis-server >/dev/null 2>&1; then
        echo "redis-server is installed: $(redis-server --version)"
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then die "installing needs root (apt-get)"; fi
    apt-get update
    DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server
    redis-server --version
}

pidfile() { echo "$1/redis.pid"; }
portfile() { echo "$1/redis.port"; }

start() {
    local port="${1:?usage: redis.sh start PORT DIR}" dir="${2:?usage: redis.sh start PORT DIR}"
    command -v redis-server >/dev/null 2>&1 || die "redis-server is missing: run redis.sh install"
    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
        --appendonly yes --appendfsync always --save "" --protected-mode yes \
        --daemonize yes --pidfile "$(pidfile "$dir")" --logfile "$dir/redis.log"
    echo "$port" > "$(portfile "$dir")"
    for _ in $(seq 1 200); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            echo "redis-server on redis://127.0.0.1:$port/0 (dir $dir, pid $(cat "$(pidfile "$dir")"))"
            return
        fi
        sleep 0.05
    done
    die "redis-server did not answer on port $port; see $dir/redis.log"
}

stop() {
    local dir="${1:?usage: redis.sh stop DIR}" pid
    [ -f "$(pidfile "$dir")" ] || die "no redis.pid in $dir: nothing started there"
    pid="$(cat "$(pidfile "$dir")")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || { echo "stopped redis-server $pid"; return; }
        sleep 0.05
    done
    die "redis-server $pid did not stop"
}

status() {
    local dir="${1:?usage: redis.sh status DIR}"
    [ -f "$(portfile "$dir")" ] || die "no server was started in $dir"
    redis-cli -h 127.0.0.1 -p "$(cat "$(portfile "$dir")")" ping | grep -q PONG
}

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    status) shift; status "$@" ;;
    *) die "usage: redis.sh install | start PORT DIR | stop DIR | status DIR" ;;
esac
