#!/usr/bin/env bash
# Installs (if missing) and runs the real storage services the tests use, all on 127.0.0.1:
#   redis-server (Debian package), Azurite blob (npm, --disableTelemetry, in memory), moto server
#   (PyPI) for DynamoDB.
# Usage: scripts/services.sh up|down|status|env
# `up` is idempotent: a service that already answers is left alone. It waits until each answers
# and writes their addresses to $CORNUS_SERVICES_DIR/env, which the test fixtures read.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${CORNUS_SERVICES_DIR:-$repo/.services}
redis_port=${CORNUS_REDIS_PORT:-16379}
azurite_port=${CORNUS_AZURITE_PORT:-10010}
moto_port=${CORNUS_MOTO_PORT:-15000}
azurite_version=3.37.0
# Redis databases: the conformance suite uses db 0; each pytest-xdist worker of a run empties dbs of
# its own, and each concurrent run takes a slot of them (tests/worker.py: REDIS_DB_COUNT). A server
# already running with fewer (an older checkout's) is reported, not used.
redis_database_count=256
# Seconds to wait for a service to answer before giving up: generous for a cold npm cache.
ready_timeout_s=60
# Azurite's fixed development account; it is public and only ever used on 127.0.0.1.
azure_key="Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

mkdir -p "$dir"

log() { printf 'services: %s\n' "$*" >&2; }

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_port() { # name port pidfile
  local name=$1 port=$2 pidfile=$3 waited=0
  until port_open "$port"; do
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      log "$name exited while starting; its log:"; tail -n 30 "$dir/$name.log" >&2 || true; return 1
    fi
    sleep 0.2; waited=$((waited + 1))
    if [ $waited -gt $((ready_timeout_s * 5)) ]; then log "$name did not answer on port $port"; return 1; fi
  done
}

install_redis() {
  command -v redis-server >/dev/null && return 0
  log "installing redis-server from Debian's packages"
  local sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq >/dev/null
  # The package's own service is not wanted: we start our own on a private port.
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
}

# Installed once per machine and version, outside the checkout, as helm and toxiproxy are: npm
# takes some 15 s of CPU for it, which every fresh clone's run paid at its start.
azurite_home=${CORNUS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/cornus}/azurite-$azurite_version

azurite_bin() { echo "$azurite_home/node_modules/.bin/azurite-blob"; }

install_azurite() {
  [ -x "$(azurite_bin)" ] && return 0
  mkdir -p "$(dirname "$azurite_home")"
  # Under a lock, into a fresh directory renamed into place: two runs installing at once never
  # see, or leave, half an install.
  (
    flock 9
    [ -x "$(azurite_bin)" ] && exit 0
    log "installing azurite@$azurite_version from npm into $azurite_home"
    staging=$(mktemp -d "$azurite_home.XXXXXX")
    trap 'rm -rf "$staging"' EXIT  # a failed install leaves nothing behind
    npm install --prefix "$staging" --no-audit --no-fund --loglevel=error "azurite@$azurite_version" >/dev/null
    rm -rf "$azurite_home"
    mv "$staging" "$azurite_home"
  ) 9>"$azurite_home.lock"
}

moto_bin() { command -v moto_server || true; }

install_moto() {
  [ -n "$(moto_bin)" ] && python3 -c "import flask, flask_cors" 2>/dev/null && return 0
  log "installing moto[server] from PyPI"
  python3 -m pip install -q "moto[server]>=5"
}

start_redis() {
  if port_open "$redis_port"; then
    local count
    count=$(redis-cli -p "$redis_port" config get databases 2>/dev/null | tail -n 1)
    if [ "${count:-0}" -lt "$redis_database_count" ] 2>/dev/null; then
      log "the redis-server on port $redis_port has ${count:-an unknown number of} databases; the tests need $redis_database_count: stop it (scripts/services.sh down) and run up again"
      return 1
    fi
    # The nodes refuse a Redis that answers writes before they are on disk (redis_durability aof):
    # say so here, once, rather than in every test that opens it.
    local appendonly appendfsync
    appendonly=$(redis-cli -p "$redis_port" config get appendonly 2>/dev/null | tail -n 1)
    appendfsync=$(redis-cli -p "$redis_port" config get appendfsync 2>/dev/null | tail -n 1)
    if [ "$appendonly" != yes ] || [ "$appendfsync" != always ]; then
      log "the redis-server on port $redis_port runs with appendonly ${appendonly:-unknown}, appendfsync ${appendfsync:-unknown}; the nodes need yes and always: stop it (scripts/services.sh down) and run up again"
      return 1
    fi
    return 0
  fi
  # appendfsync always: an acknowledged VOTE_YES must survive a restart (DESIGN section 3).
  redis-server --bind 127.0.0.1 --port "$redis_port" --daemonize yes --save '' \
    --databases "$redis_database_count" \
    --appendonly yes --appendfsync always --dir "$dir" --appendfilename redis.aof \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  wait_port redis "$redis_port" "$dir/redis.pid"
}

# Each launch_ starts a service without waiting for it (wait_port does), so that one's start-up
# overlaps another's install: moto's imports take seconds, and a fresh clone installs Azurite.
launch_azurite() {
  if port_open "$azurite_port"; then return 0; fi
  # Through our launcher, which collects unreferenced extents in one pass: Azurite's own removes
  # them one at a time and froze for minutes in long runs (scripts/azurite_blob.js says how).
  nohup node "$repo/scripts/azurite_blob.js" "$(azurite_bin)" --blobHost 127.0.0.1 --blobPort "$azurite_port" \
    --inMemoryPersistence --disableTelemetry --skipApiVersionCheck --silent >"$dir/azurite.log" 2>&1 &
  echo $! >"$dir/azurite.pid"
}

launch_moto() {
  if port_open "$moto_port"; then return 0; fi
  # Through our launcher, which serves one request at a time: moto's threaded server races on
  # concurrent transactional writes (scripts/moto_serial.py says how).
  nohup python3 "$repo/scripts/moto_serial.py" -H 127.0.0.1 -p "$moto_port" >"$dir/moto.log" 2>&1 &
  echo $! >"$dir/moto.pid"
}

write_env() {
  # Single-quoted so the file can be sourced by a shell too (the Azure string holds ';').
  cat >"$dir/env" <<EOF
CORNUS_TEST_REDIS_URL='redis://127.0.0.1:$redis_port/0'
CORNUS_TEST_AZURE_CONNECTION_STRING='DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=$azure_key;BlobEndpoint=http://127.0.0.1:$azurite_port/devstoreaccount1;'
CORNUS_TEST_DYNAMODB_ENDPOINT='http://127.0.0.1:$moto_port'
CORNUS_REDIS_SERVER_BIN='$(command -v redis-server)'
CORNUS_AZURITE_BLOB_BIN='$(azurite_bin)'
CORNUS_MOTO_LAUNCHER='$repo/scripts/moto_serial.py'
EOF
}

status() {
  local ok=0
  for pair in "redis:$redis_port" "azurite:$azurite_port" "moto:$moto_port"; do
    local name=${pair%%:*} port=${pair##*:}
    if port_open "$port"; then echo "$name  listening on 127.0.0.1:$port"; else echo "$name  DOWN (127.0.0.1:$port)"; ok=1; fi
  done
  return $ok
}

stop_one() { # name
  local pidfile="$dir/$1.pid"
  [ -f "$pidfile" ] || return 0
  local pid; pid=$(cat "$pidfile")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
}

case "${1:-}" in
  up)
    install_redis; install_moto
    start_redis
    launch_moto
    install_azurite
    launch_azurite
    wait_port moto "$moto_port" "$dir/moto.pid"
    wait_port azurite "$azurite_port" "$dir/azurite.pid"
    write_env
    status
    echo "addresses written to $dir/env"
    ;;
  down)
    stop_one redis; stop_one azurite; stop_one moto
    rm -f "$dir/redis.aof" "$dir"/appendonlydir/* 2>/dev/null || true
    ;;
  status) status ;;
  env) write_env; cat "$dir/env" ;;
  *) echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
