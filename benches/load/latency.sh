#!/usr/bin/env bash
# Fixed-rate latency of the three paths in one run (BENCHMARKS.md, "What holds the
# figures", item 12): direct to an nginx upstream (one worker), idemgate on Redis,
# idemgate on the memory store; RATE (2000) req/s for SECS (5) each. LOG= idemgate's
# IDEMGATE_LOG (info); STATS=1 adds Redis's LATENCY HISTOGRAM of EVALSHA.
#   cargo build --profile dist --bin idemgate --example loadgen && benches/load/latency.sh
set -u
cd "$(dirname "$0")/../.."
. benches/load/lib.sh
start_redis
NGINX_WORKERS=1 start_upstream
for store in redis memory; do
  port=$(free_port); admin=$(free_port)
  url=""; [ $store = redis ] && url="redis://127.0.0.1:$REDIS_PORT/0"
  idemgate_config "$work/$store.toml" "$port" "$admin" "$url"
  IDEMGATE_LOG=${LOG:-info} ${BIN:-target/$PROFILE/idemgate} run --config "$work/$store.toml" 2>/dev/null &
  pids+=($!); wait_port "$admin"
  eval "PORT_$store=$port"
done
L=${CARGO_TARGET_DIR:-target}/$PROFILE/examples/loadgen
echo "direct: $($L "http://127.0.0.1:$UP_PORT/webhooks/load" "${RATE:-2000}" "${SECS:-5}" "$SECRET")"
echo "redis:  $($L "http://127.0.0.1:$PORT_redis/webhooks/load" "${RATE:-2000}" "${SECS:-5}" "$SECRET")"
echo "memory: $($L "http://127.0.0.1:$PORT_memory/webhooks/load" "${RATE:-2000}" "${SECS:-5}" "$SECRET")"
[ -n "${STATS:-}" ] && redis-cli -p "$REDIS_PORT" latency histogram evalsha | tr "\n" " " | head -c 1500 && echo
exit 0
