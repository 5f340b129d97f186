#!/usr/bin/env bash
# The whole-process load benchmark. Starts, on loopback ports of this machine:
# redis-server, an nginx upstream answering `200 ok`, an nginx `proxy_pass` with
# upstream keep-alive, and idemgate (Redis store) in front of the same upstream; drives
# each with wrk (THREADS threads, CONNS connections, 1 KiB signed Standard Webhooks
# deliveries) in one run, then a fixed-rate run (loadgen) for the latency idemgate
# adds over direct. Prints one table.
#
#   benches/load/run.sh                 # 10 s per target (the figures in BENCHMARKS.md)
#   DURATION=2 benches/load/run.sh      # a smoke run (CI)
#
# Every run is bounded (wrk -d, loadgen RATE×SECONDS); every process is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-10}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
RATE=${RATE:-2000}
RATE_SECONDS=${RATE_SECONDS:-$DURATION}
DUP_SHARE=${DUP_SHARE:-0.5}

need=()
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
command -v wrk >/dev/null 2>&1 || need+=(wrk)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

cargo build --release --quiet --bin idemgate --example loadgen
BIN=target/release/idemgate
LOADGEN=target/release/examples/loadgen

. benches/load/lib.sh
start_redis

start_upstream
PROXY_PORT=$(free_port)
start_nginx proxy "$PROXY_PORT" "upstream app { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:$PROXY_PORT; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"

IG_PID=""
start_idemgate() {
  IG_PORT=$(free_port); IG_ADMIN=$(free_port)
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  idemgate_config "$work/idemgate.toml" "$IG_PORT" "$IG_ADMIN" "redis://127.0.0.1:$REDIS_PORT/0"
  IDEMGATE_LOG=${IDEMGATE_LOG:-info} "$BIN" run --config "$work/idemgate.toml" >/dev/null 2>"$work/idemgate.log" &
  IG_PID=$!
  pids+=("$IG_PID")
  wait_port "$IG_ADMIN"
  sleep 0.5
  IDLE_RSS_KB=$(awk '/VmRSS/{print $2}' /proc/$IG_PID/status)
}
stop_idemgate() { kill -TERM "$IG_PID" 2>/dev/null || true; wait "$IG_PID" 2>/dev/null || true; }
cpu_ticks() { awk '{print $14+$15}' /proc/"$1"/stat; }

# Request data: enough fresh ids for DURATION at up to 20k req/s per thread.
PER_THREAD=${PER_THREAD:-$((DURATION * 20000))}
python3 benches/load/gen_requests.py "$work/fresh" "$THREADS" "$PER_THREAD" 0 "$SECRET"
python3 benches/load/gen_requests.py "$work/half" "$THREADS" "$PER_THREAD" "$DUP_SHARE" "$SECRET"

run_wrk() { # data-dir url -> RESULT line
  IDEMGATE_LOAD_DIR="$1" wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 10s \
    -s benches/load/deliveries.lua "$2" | grep '^RESULT'
}
field() { sed -E "s/.* $2=([0-9]+).*/\1/" <<<" $1"; }

rows=()
add_row() { # name result [rss_peak_kb cpu_s_per_1000 idle_kb]
  local r=$2 req dur rps
  req=$(field "$r" requests); dur=$(field "$r" duration_us)
  rps=$(python3 -c "print(round($req/($dur/1e6)))")
  rows+=("$1|$rps|$(field "$r" p50_us)|$(field "$r" p99_us)|$(field "$r" non2xx)|${3:--}|${4:--}|${5:--}|$(field "$r" wrapped)")
  echo "$1: $rps req/s" >&2
}

measure_idemgate() { # name data-dir
  start_idemgate
  local t0 t1 r req hwm cpu
  t0=$(cpu_ticks "$IG_PID")
  r=$(run_wrk "$2" "http://127.0.0.1:$IG_PORT/webhooks/load")
  t1=$(cpu_ticks "$IG_PID")
  hwm=$(awk '/VmHWM/{print $2}' /proc/$IG_PID/status)
  req=$(field "$r" requests)
  cpu=$(python3 -c "print(f'{($t1-$t0)/$(getconf CLK_TCK)/($req/1000):.3f}')")
  add_row "$1" "$r" "$((hwm / 1024)) MiB" "$cpu" "$((IDLE_RSS_KB / 1024)) MiB"
  stop_idemgate
}

add_row "direct to upstream (nginx)" "$(run_wrk "$work/fresh" "http://127.0.0.1:$UP_PORT/webhooks/load")"
add_row "nginx proxy_pass, keep-alive" "$(run_wrk "$work/fresh" "http://127.0.0.1:$PROXY_PORT/webhooks/load")"
measure_idemgate "idemgate, first deliveries" "$work/fresh"
measure_idemgate "idemgate, ${DUP_SHARE} duplicates" "$work/half"

# Fixed rate: the latency idemgate adds over direct at a moderate rate.
fr_direct=$("$LOADGEN" "http://127.0.0.1:$UP_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
start_idemgate
fr_ig=$("$LOADGEN" "http://127.0.0.1:$IG_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
stop_idemgate

echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1024/1024)}' /proc/meminfo) GiB; wrk -t$THREADS -c$CONNS -d${DURATION}s; 1 KiB signed deliveries; IDEMGATE_LOG=${IDEMGATE_LOG:-info}"
echo
echo "| target | req/s | p50 µs | p99 µs | non-2xx | peak RSS | CPU s / 1000 | idle RSS | id wraps |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
proxy=$(cut -d'|' -f2 <<<"${rows[1]}")
first=$(cut -d'|' -f2 <<<"${rows[2]}")
half=$(cut -d'|' -f2 <<<"${rows[3]}")
echo
python3 - "$proxy" "$first" "$half" <<'PY'
import sys
p, f, h = map(float, sys.argv[1:])
print(f"ratio idemgate / nginx-proxy: first deliveries {f/p:.2f} (target >= 0.5), half duplicates {h/p:.2f} (target >= 0.6)")
PY
echo
echo "fixed rate ${RATE} req/s for ${RATE_SECONDS}s (loadgen, latency from scheduled send time):"
echo "| target | requests | non-2xx | p50 µs | p99 µs | max µs |"
echo "|---|---|---|---|---|---|"
for pair in "direct|$fr_direct" "idemgate|$fr_ig"; do
  n=${pair%%|*}; r=${pair#*|}
  echo "| $n | $(field "$r" requests) | $(field "$r" non2xx) | $(field "$r" p50_us) | $(field "$r" p99_us) | $(field "$r" max_us) |"
done
python3 - "$(field "$fr_direct" p50_us)" "$(field "$fr_direct" p99_us)" "$(field "$fr_ig" p50_us)" "$(field "$fr_ig" p99_us)" <<'PY'
import sys
d50, d99, i50, i99 = map(int, sys.argv[1:])
print(f"\nadded latency over direct: p50 {(i50-d50)/1000:.3f} ms (target <= 0.3), p99 {(i99-d99)/1000:.3f} ms (target <= 1)")
PY
