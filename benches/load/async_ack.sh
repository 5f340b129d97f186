#!/usr/bin/env bash
# Acknowledgement latency, sync vs async mode, on the same load: one redis-server, an
# upstream that answers after DELAY seconds (benches/load/slow_upstream.py), and two
# idemgate processes on the Redis store, one route each: `mode = "sync"` and
# `mode = "async"`. loadgen sends RATE fresh signed deliveries a second for SECONDS to
# each in turn and prints the latency a provider sees (p50, p99).
#
#   benches/load/async_ack.sh                   # DELAY=0.05 RATE=200 SECONDS=10
#   DELAY=0 benches/load/async_ack.sh           # an upstream that answers at once
set -euo pipefail
cd "$(dirname "$0")/../.."

DELAY=${DELAY:-0.05}
RATE=${RATE:-200}
SECONDS_=${SECONDS_:-10}
T=${CARGO_TARGET_DIR:-target}

. benches/load/lib.sh
cargo build --profile "$PROFILE" --quiet --bin idemgate --example loadgen
BIN=$T/$PROFILE/idemgate
LOADGEN=$T/$PROFILE/examples/loadgen

start_redis

UP_PORT=$(free_port)
python3 benches/load/slow_upstream.py "$UP_PORT" "$DELAY" &
pids+=($!)
wait_port "$UP_PORT"

start_idemgate() { # mode; sets STARTED_PORT (not a $(…) subshell: pids must see the pid)
  local port admin
  port=$(free_port); admin=$(free_port)
  cat >"$work/$1.toml" <<CONF
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
upstream = "http://127.0.0.1:$UP_PORT"
[store]
url = "redis://127.0.0.1:$REDIS_PORT/0"
key_prefix = "bench-$1"
[[route]]
name = "wh"
path = "/webhooks/wh"
provider = "standard"
secrets = ["$SECRET"]
mode = "$1"
CONF
  IDEMGATE_LOG=warn "$BIN" run --config "$work/$1.toml" >"$work/$1.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
  STARTED_PORT=$port
}

start_idemgate sync; SYNC_PORT=$STARTED_PORT
start_idemgate async; ASYNC_PORT=$STARTED_PORT

echo "upstream delay ${DELAY}s, ${RATE}/s for ${SECONDS_}s, $(nproc) cores"
for mode in sync async; do
  port=SYNC_PORT; [ "$mode" = async ] && port=ASYNC_PORT
  printf '%-6s ' "$mode"
  "$LOADGEN" "http://127.0.0.1:${!port}/webhooks/wh" "$RATE" "$SECONDS_" "$SECRET" | grep RESULT
done
