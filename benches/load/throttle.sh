#!/usr/bin/env bash
# Throttled delivery (docs/async.md, "Protecting the application"): one redis-server,
# SIDECARS idemgate processes (release build) sharing it with one async route limited
# to MAX_CONCURRENCY at once and RATE per second (burst = BURST, default the rate), and
# throttle_probe as both the provider and the application: it sends N deliveries as
# fast as they are acknowledged (a backlog arriving at once), the application answers
# after DELAY_MS, and it prints the rate and concurrency the application saw and how
# long deliveries waited in the backlog.
#
#   benches/load/throttle.sh                        # N=5000 RATE=200 MAX_CONCURRENCY=4
#   RATE=1000 MAX_CONCURRENCY=16 N=20000 benches/load/throttle.sh
#   RATE=none MAX_CONCURRENCY=none benches/load/throttle.sh   # no throttling: the baseline
set -euo pipefail
cd "$(dirname "$0")/../.."

N=${N:-5000}
RATE=${RATE:-200}
BURST=${BURST:-$RATE}
MAX_CONCURRENCY=${MAX_CONCURRENCY:-4}
DELAY_MS=${DELAY_MS:-5}
SIDECARS=${SIDECARS:-3}
T=${CARGO_TARGET_DIR:-target}

. benches/load/lib.sh
cargo build --profile "$PROFILE" --quiet --bin idemgate --example throttle_probe
BIN=${BIN:-$T/$PROFILE/idemgate}

start_redis
APP_PORT=$(free_port)

urls=()
for i in $(seq 1 "$SIDECARS"); do
  port=$(free_port); admin=$(free_port)
  cat >"$work/s$i.toml" <<CONF
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$admin"
upstream = "http://127.0.0.1:$APP_PORT"
[store]
url = "redis://127.0.0.1:$REDIS_PORT/0"
key_prefix = "bench-throttle"
[[route]]
name = "wh"
path = "/webhooks/wh"
provider = "standard"
secrets = ["$SECRET"]
mode = "async"
$([ "$MAX_CONCURRENCY" = none ] || echo "max_concurrency = $MAX_CONCURRENCY")
$([ "$RATE" = none ] || printf 'rate = %s\nburst = %s' "$RATE" "$BURST")
[async]
max_queue = 1000000
CONF
  POD_NAME="bench-$i" IDEMGATE_LOG=warn "$BIN" run --config "$work/s$i.toml" >"$work/s$i.log" 2>&1 &
  pids+=($!)
  wait_port "$port"
  urls+=("http://127.0.0.1:$port/webhooks/wh")
done

echo "configured: $SIDECARS sidecars, max_concurrency=$MAX_CONCURRENCY rate=$RATE/s burst=$BURST; application answers after ${DELAY_MS} ms; $N deliveries; $(nproc) cores"
"$T/$PROFILE/examples/throttle_probe" "$APP_PORT" "$DELAY_MS" "$N" "$SECRET" "${urls[@]}" | grep RESULT
