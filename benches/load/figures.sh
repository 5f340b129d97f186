#!/usr/bin/env bash
# Issue 33's figures in one run, each printed against its target: CPU per delivery
# (sidecar + Redis) against the nginx + Lua + Redis peer (peer's nginx + Redis), req/s
# against the peer and against nginx `proxy_pass`, with one worker each and with two
# (idemgate's `worker_threads`, nginx's `worker_processes`); CPU per delivery of two
# runtimes against one; the latency idemgate adds over direct at a fixed rate (three
# runs); an async route's CPU per delivered delivery and its acknowledgement latency;
# peak RSS. Everything on loopback ports of this machine, every run bounded.
#
#   benches/load/figures.sh                  # 10 s per wrk row, 10 s per fixed-rate run
#   WORKERS="1" DURATION=5 benches/load/figures.sh   # quicker: one worker each only
#   BIN=/path/to/idemgate benches/load/figures.sh    # another binary (no build)
#
# CPU per delivery is a process's CPU ticks (utime + stime) over the requests wrk
# completed: the peer's master and workers, idemgate's process, the one redis-server.
set -euo pipefail
cd "$(dirname "$0")/../.."

COPY_SHARE=${COPY_SHARE:-0.98}
WORKERS=${WORKERS:-1 2}
LAT_RUNS=${LAT_RUNS:-3}
. benches/load/lib.sh
install_missing
if ! peer_available; then
  echo "installing ${LUA_PEER_PACKAGES[*]} (the nginx + Lua + Redis peer)" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${LUA_PEER_PACKAGES[@]}"; } >/dev/null 2>&1 || true
  peer_available || { echo "the nginx + Lua + Redis peer cannot be installed here" >&2; exit 1; }
fi
if [ -z "${BIN:-}" ]; then
  cargo build --profile "$PROFILE" --quiet --bin idemgate --example loadgen
  BIN=${CARGO_TARGET_DIR:-target}/$PROFILE/idemgate
fi
LOADGEN=${LOADGEN:-${CARGO_TARGET_DIR:-target}/$PROFILE/examples/loadgen}
[ -x "$LOADGEN" ] || cargo build --profile "$PROFILE" --quiet --example loadgen

start_redis
NGINX_WORKERS=1 start_upstream
PER_THREAD=${PER_THREAD:-$((DURATION * 20000))}
python3 benches/load/gen_requests.py "$work/fresh" "$THREADS" "$PER_THREAD" 0 "$SECRET"
python3 benches/load/gen_requests.py "$work/copies" "$THREADS" "$PER_THREAD" "$COPY_SHARE" "$SECRET"

# One result per measurement: req/s, CPU µs per request of the server and of Redis.
declare -A RPS CPU RCPU
HWM_KB=0
us_per_req() { python3 -c "print(round($1 / $(getconf CLK_TCK) * 1e6 / $2, 1))"; } # ticks requests
rps_of() { python3 -c "print(round($(field "$1" requests) / ($(field "$1" duration_us) / 1e6)))"; }

# Runs wrk over data dir $2 against URL $3 while counting the CPU of processes $4...;
# stores its figures under tag $1.
measure() {
  local tag=$1 data=$2 url=$3; shift 3
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  local t0 r0 r req
  t0=$(ticks_of "$@"); r0=$(cpu_ticks "$REDIS_PID")
  r=$(run_wrk "$data" "$url")
  req=$(field "$r" requests)
  CPU[$tag]=$(us_per_req $(($(ticks_of "$@") - t0)) "$req")
  RCPU[$tag]=$(us_per_req $(($(cpu_ticks "$REDIS_PID") - r0)) "$req")
  RPS[$tag]=$(rps_of "$r")
  [ "$(field "$r" non2xx)" = 0 ] || echo "$tag: $(field "$r" non2xx) non-2xx answers" >&2
  echo "$tag: ${RPS[$tag]} req/s, ${CPU[$tag]} + ${RCPU[$tag]} µs CPU per request" >&2
}

IG_PID=""
start_idemgate() { # worker_threads [mode]
  IG_PORT=$(free_port); IG_ADMIN=$(free_port)
  idemgate_config "$work/ig.toml" "$IG_PORT" "$IG_ADMIN" "redis://127.0.0.1:$REDIS_PORT/0"
  sed -i "1i worker_threads = $1" "$work/ig.toml"
  [ "${2:-sync}" = async ] && echo 'mode = "async"' >>"$work/ig.toml"
  IDEMGATE_LOG=${IDEMGATE_LOG:-info} "$BIN" run --config "$work/ig.toml" >/dev/null 2>"$work/idemgate.log" &
  IG_PID=$!; pids+=("$IG_PID")
  wait_port "$IG_ADMIN"; wait_port "$IG_PORT"
}
stop_idemgate() {
  local hwm
  hwm=$(awk '/VmHWM/{print $2}' /proc/"$IG_PID"/status)
  echo "idemgate peak RSS: $((hwm / 1024)) MiB" >&2
  [ "$hwm" -gt "$HWM_KB" ] && HWM_KB=$hwm
  kill -TERM "$IG_PID" 2>/dev/null || true; wait "$IG_PID" 2>/dev/null || true
}

for w in $WORKERS; do
  PROXY_PORT=$(free_port)
  NGINX_WORKERS=$w start_nginx "proxy$w" "$PROXY_PORT" "upstream app { server 127.0.0.1:$UP_PORT; keepalive 64; }
    server { listen 127.0.0.1:$PROXY_PORT; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"
  measure "proxy_copies$w" "$work/copies" "http://127.0.0.1:$PROXY_PORT/webhooks/load" "$NGINX_PID" $(pgrep -P "$NGINX_PID")
  kill -TERM "$NGINX_PID"; wait "$NGINX_PID" 2>/dev/null || true

  PEER_WORKERS=$w start_peer
  python3 benches/load/peer_lua/check.py "$PEER_PORT" "$SECRET"
  procs=("$PEER_PID" $(pgrep -P "$PEER_PID"))
  measure "peer_first$w" "$work/fresh" "http://127.0.0.1:$PEER_PORT/webhooks/load" "${procs[@]}"
  measure "peer_copies$w" "$work/copies" "http://127.0.0.1:$PEER_PORT/webhooks/load" "${procs[@]}"
  kill -TERM "$PEER_PID"; wait "$PEER_PID" 2>/dev/null || true

  start_idemgate "$w"
  measure "ig_first$w" "$work/fresh" "http://127.0.0.1:$IG_PORT/webhooks/load" "$IG_PID"
  stop_idemgate
  start_idemgate "$w"
  measure "ig_copies$w" "$work/copies" "http://127.0.0.1:$IG_PORT/webhooks/load" "$IG_PID"
  stop_idemgate
done

# Async: first deliveries acknowledged from the queue; the CPU counted until the queue
# is empty, over the deliveries accepted.
start_idemgate 1 async
redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
t0=$(cpu_ticks "$IG_PID"); r0=$(cpu_ticks "$REDIS_PID")
r=$(run_wrk "$work/fresh" "http://127.0.0.1:$IG_PORT/webhooks/load")
accepted=$(( $(field "$r" requests) - $(field "$r" non2xx) ))
queued() { curl -fsS "http://127.0.0.1:$IG_ADMIN/metrics" | awk '/^idemgate_queue_(depth|pending)\{/{s+=$2} END{print s+0}'; }
for _ in $(seq 1 1200); do [ "$(queued)" = 0 ] && break; sleep 0.1; done
left=$(queued)
ASYNC_CPU=$(us_per_req $(($(cpu_ticks "$IG_PID") - t0)) "$accepted")
ASYNC_RCPU=$(us_per_req $(($(cpu_ticks "$REDIS_PID") - r0)) "$accepted")
echo "async: $accepted accepted ($left still queued), $ASYNC_CPU + $ASYNC_RCPU µs CPU per delivered" >&2
ack=$("$LOADGEN" "http://127.0.0.1:$IG_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
stop_idemgate

# Fixed rate: the latency idemgate (one worker) adds over direct, LAT_RUNS runs.
lat=()
for _ in $(seq 1 "$LAT_RUNS"); do
  d=$("$LOADGEN" "http://127.0.0.1:$UP_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
  start_idemgate 1
  i=$("$LOADGEN" "http://127.0.0.1:$IG_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
  stop_idemgate
  lat+=("$(field "$d" p50_us) $(field "$d" p99_us) $(field "$i" p50_us) $(field "$i" p99_us) $(field "$i" non2xx)")
done

echo
echo "machine: $(nproc) cores; wrk -t$THREADS -c$CONNS -d${DURATION}s; 1 KiB signed deliveries; $BIN"
{
  for k in "${!RPS[@]}"; do echo "rps $k ${RPS[$k]} ${CPU[$k]} ${RCPU[$k]}"; done
  echo "async $ASYNC_CPU $ASYNC_RCPU $(field "$ack" p50_us) $(field "$ack" p99_us) $(field "$ack" non2xx)"
  for l in "${lat[@]}"; do echo "lat $l"; done
  echo "hwm $HWM_KB"
  echo "workers $WORKERS"
} | python3 benches/load/figures.py
