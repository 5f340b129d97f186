#!/usr/bin/env bash
# The whole-process load benchmark. Starts, on loopback ports of this machine:
# redis-server, an nginx upstream answering `200 ok`, an nginx `proxy_pass` with
# upstream keep-alive, an nginx + Lua + Redis peer (benches/load/peer_lua: the same
# signature check, claim, forward and record, written OpenResty-style), and idemgate
# (Redis store) in front of the same upstream; drives each with wrk (THREADS threads,
# CONNS connections, 1 KiB signed Standard Webhooks deliveries: first deliveries,
# DUP_SHARE duplicates, COPY_SHARE duplicates) in one run, then a fixed-rate run
# (loadgen) for the latency idemgate adds over direct. Prints one table and the ratios.
#
#   benches/load/run.sh                 # 10 s per target (the figures in BENCHMARKS.md)
#   DURATION=2 benches/load/run.sh      # a smoke run (CI)
#   PEER=0 benches/load/run.sh          # without the nginx + Lua + Redis peer
#   PEER_WORKERS=1 benches/load/run.sh  # the peer with one nginx worker (default: auto)
#   BOUND_MEMORY=16MiB benches/load/run.sh  # the memory store's bound in its "at the bound" row
#                                       # (default 16MiB; 2MiB when DURATION < 10)
#   ONLY=memory benches/load/run.sh     # the memory store's rows (empty, at the bound), with
#                                       # direct and idemgate-on-Redis as the same run's reference
#   FSYNC=250ms benches/load/run.sh     # the file store row with store.fsync = "250ms" (default: always)
#
# The peer needs Debian's libnginx-mod-http-lua, lua-nginx-redis and lua-nginx-string;
# they are installed when missing, and where that fails its rows are skipped (said so,
# the run goes on). A peer that starts but answers wrongly fails the run.
#
# Every run is bounded (wrk -d, loadgen RATE×SECONDS); every process is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

DUP_SHARE=${DUP_SHARE:-0.5}
COPY_SHARE=${COPY_SHARE:-0.98}
PEER=${PEER:-1}
. benches/load/lib.sh
install_missing

peer_skip=""
if [ "$PEER" != 1 ]; then
  peer_skip="PEER=$PEER"
elif ! peer_available; then
  echo "installing ${LUA_PEER_PACKAGES[*]} (the nginx + Lua + Redis peer)" >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${LUA_PEER_PACKAGES[@]}"; } >/dev/null 2>&1 || true
  if ! peer_available; then
    peer_skip="Debian's ${LUA_PEER_PACKAGES[*]} are not installed and could not be installed here"
  fi
fi
if [ -n "$peer_skip" ]; then
  echo "SKIPPING the nginx + Lua + Redis peer: $peer_skip" >&2
fi

cargo build --profile "$PROFILE" --quiet --bin idemgate --example loadgen
BIN=${CARGO_TARGET_DIR:-target}/$PROFILE/idemgate
LOADGEN=${CARGO_TARGET_DIR:-target}/$PROFILE/examples/loadgen

start_redis

start_upstream
PROXY_PORT=$(free_port)
start_nginx proxy "$PROXY_PORT" "upstream app { server 127.0.0.1:$UP_PORT; keepalive 64; }
  server { listen 127.0.0.1:$PROXY_PORT; location / { proxy_pass http://app; proxy_http_version 1.1; proxy_set_header Connection \"\"; } }"

IG_PID=""
start_idemgate() {
  IG_PORT=$(free_port); IG_ADMIN=$(free_port)
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  local url="redis://127.0.0.1:$REDIS_PORT/0"
  [ "${IG_STORE:-redis}" = memory ] && url=""
  # The file store: a new directory each start, fsynced as FSYNC says.
  if [ "${IG_STORE:-redis}" = file ]; then
    rm -rf "$work/file-store"; url="file:$work/file-store"
  fi
  idemgate_config "$work/idemgate.toml" "$IG_PORT" "$IG_ADMIN" "$url"
  if [ "${IG_STORE:-redis}" = file ]; then
    sed -i "/^url = /a fsync = \"${FSYNC:-always}\"" "$work/idemgate.toml"
  fi
  IDEMGATE_LOG=${IDEMGATE_LOG:-info} "$BIN" run --config "$work/idemgate.toml" >/dev/null 2>"$work/idemgate.log" &
  IG_PID=$!
  pids+=("$IG_PID")
  wait_port "$IG_ADMIN"
  sleep 0.5
  IDLE_RSS_KB=$(awk '/VmRSS/{print $2}' /proc/$IG_PID/status)
}
stop_idemgate() { kill -TERM "$IG_PID" 2>/dev/null || true; wait "$IG_PID" 2>/dev/null || true; }
# Request data: enough fresh ids for DURATION at up to 20k req/s per thread.
PER_THREAD=${PER_THREAD:-$((DURATION * 20000))}
python3 benches/load/gen_requests.py "$work/fresh" "$THREADS" "$PER_THREAD" 0 "$SECRET"
python3 benches/load/gen_requests.py "$work/half" "$THREADS" "$PER_THREAD" "$DUP_SHARE" "$SECRET"
python3 benches/load/gen_requests.py "$work/copies" "$THREADS" "$PER_THREAD" "$COPY_SHARE" "$SECRET"
# Other first deliveries, to fill the memory store up to its bound before its row.
python3 benches/load/gen_requests.py "$work/fill" "$THREADS" "$PER_THREAD" 0 "$SECRET" fill

rows=()
declare -A rps_of
add_row() { # tag name result [peak_rss cpu_s_per_1000 idle_rss redis_cpu_s_per_1000]
  local r=$3 req dur rps
  req=$(field "$r" requests); dur=$(field "$r" duration_us)
  rps=$(python3 -c "print(round($req/($dur/1e6)))")
  rps_of[$1]=$rps
  rows+=("$2|$rps|$(field "$r" p50_us)|$(field "$r" p99_us)|$(field "$r" non2xx)|${4:--}|${5:--}|${6:--}|${7:--}|$(field "$r" wrapped)")
  echo "$2: $rps req/s" >&2
}
skip_row() { rows+=("$1|skipped|-|-|-|-|-|-|-|-"); }

measure_idemgate() { # tag name data-dir [fill-data-dir]
  start_idemgate
  if [ -n "${4:-}" ]; then
    # Fill the store first: the row is measured with the bound reached (evicting).
    run_wrk "$4" "http://127.0.0.1:$IG_PORT/webhooks/load" >/dev/null
    local evicted
    evicted=$(curl -fsS "http://127.0.0.1:$IG_ADMIN/metrics" | awk '/^idemgate_store_evictions_total /{print $2}')
    if [ "${evicted:-0}" = 0 ]; then
      echo "the fill did not reach the bound (no evictions): lower BOUND_MEMORY" >&2; exit 1
    fi
    echo "$2: filled, $evicted evictions so far" >&2
  fi
  local t0 t1 r0 r1 r req hwm
  t0=$(cpu_ticks "$IG_PID"); r0=$(cpu_ticks "$REDIS_PID")
  r=$(run_wrk "$3" "http://127.0.0.1:$IG_PORT/webhooks/load")
  t1=$(cpu_ticks "$IG_PID"); r1=$(cpu_ticks "$REDIS_PID")
  hwm=$(awk '/VmHWM/{print $2}' /proc/$IG_PID/status)
  req=$(field "$r" requests)
  add_row "$1" "$2" "$r" "$((hwm / 1024)) MiB" "$(per_1000 $((t1 - t0)) "$req")" "$((IDLE_RSS_KB / 1024)) MiB" \
    "$(per_1000 $((r1 - r0)) "$req")"
  stop_idemgate
  if [ "${IG_STORE:-redis}" = file ]; then
    FILE_STORE_DISK="$(du -sm "$work/file-store" | cut -f1) MiB on disk after $req deliveries"
  fi
}

# The peer's CPU is its master's and workers' (no RSS: summed over processes it would
# count the shared pages once per worker).
measure_peer() { # tag name data-dir
  redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
  local procs t0 t1 r0 r1 r req
  mapfile -t procs < <(echo "$PEER_PID"; pgrep -P "$PEER_PID")
  t0=$(ticks_of "${procs[@]}"); r0=$(cpu_ticks "$REDIS_PID")
  r=$(run_wrk "$3" "http://127.0.0.1:$PEER_PORT/webhooks/load")
  t1=$(ticks_of "${procs[@]}"); r1=$(cpu_ticks "$REDIS_PID")
  req=$(field "$r" requests)
  add_row "$1" "$2" "$r" "-" "$(per_1000 $((t1 - t0)) "$req")" "-" "$(per_1000 $((r1 - r0)) "$req")"
}

if [ "${ONLY:-}" != memory ]; then
  PEER_NAME="nginx + Lua + Redis peer"
  add_row direct "direct to upstream (nginx)" "$(run_wrk "$work/fresh" "http://127.0.0.1:$UP_PORT/webhooks/load")"
  add_row proxy "nginx proxy_pass, keep-alive" "$(run_wrk "$work/fresh" "http://127.0.0.1:$PROXY_PORT/webhooks/load")"
  add_row proxy_copies "nginx proxy_pass, keep-alive, ${COPY_SHARE} duplicates (all forwarded)" \
    "$(run_wrk "$work/copies" "http://127.0.0.1:$PROXY_PORT/webhooks/load")"
  if [ -z "$peer_skip" ]; then
    start_peer || { cat "$work/nginx-peer/logs/error.log" >&2; echo "the nginx + Lua + Redis peer did not start" >&2; exit 1; }
    python3 benches/load/peer_lua/check.py "$PEER_PORT" "$SECRET"
    measure_peer peer_first "$PEER_NAME, first deliveries" "$work/fresh"
    measure_peer peer_half "$PEER_NAME, ${DUP_SHARE} duplicates" "$work/half"
    measure_peer peer_copies "$PEER_NAME, ${COPY_SHARE} duplicates" "$work/copies"
    if grep -q '\[error\]' "$work/nginx-peer/logs/error.log"; then
      echo "the peer logged errors:" >&2; grep '\[error\]' "$work/nginx-peer/logs/error.log" | head -5 >&2
    fi
    kill -TERM "$PEER_PID" 2>/dev/null || true; wait "$PEER_PID" 2>/dev/null || true
  else
    for n in "first deliveries" "${DUP_SHARE} duplicates" "${COPY_SHARE} duplicates"; do skip_row "$PEER_NAME, $n"; done
  fi
  measure_idemgate ig_first "idemgate, first deliveries" "$work/fresh"
  measure_idemgate ig_half "idemgate, ${DUP_SHARE} duplicates" "$work/half"
  measure_idemgate ig_copies "idemgate, ${COPY_SHARE} duplicates" "$work/copies"
  IG_STORE=file measure_idemgate ig_file "idemgate, file store (fsync = ${FSYNC:-always}), first deliveries" "$work/fresh"
else
  add_row direct "direct to upstream (nginx)" "$(run_wrk "$work/fresh" "http://127.0.0.1:$UP_PORT/webhooks/load")"
  measure_idemgate ig_first "idemgate, first deliveries" "$work/fresh"
fi
IG_STORE=memory measure_idemgate ig_memory "idemgate, memory store, first deliveries (empty store, filling)" "$work/fresh"
# The same load on a store already at its bound: every new delivery evicts the oldest.
# A short run (the CI smoke's DURATION=2) fills too few deliveries for 16 MiB: 2 MiB then.
if [ "$DURATION" -ge 10 ]; then BOUND_MEMORY=${BOUND_MEMORY:-16MiB}; else BOUND_MEMORY=${BOUND_MEMORY:-2MiB}; fi
IG_STORE=memory IG_MAX_MEMORY=$BOUND_MEMORY measure_idemgate ig_memory_bound \
  "idemgate, memory store at its bound (max_memory = $BOUND_MEMORY), first deliveries" "$work/fresh" "$work/fill"

if [ "${ONLY:-}" != memory ]; then
  # Fixed rate: the latency idemgate adds over direct at a moderate rate.
  fr_direct=$("$LOADGEN" "http://127.0.0.1:$UP_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
  start_idemgate
  fr_ig=$("$LOADGEN" "http://127.0.0.1:$IG_PORT/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
  stop_idemgate

fi
echo
echo "machine: $(nproc) cores, $(awk '/MemTotal/{print int($2/1024/1024)}' /proc/meminfo) GiB; wrk -t$THREADS -c$CONNS -d${DURATION}s; 1 KiB signed deliveries; IDEMGATE_LOG=${IDEMGATE_LOG:-info}"
echo
echo "| target | req/s | p50 µs | p99 µs | non-2xx | peak RSS | CPU s / 1000 | idle RSS | Redis CPU s / 1000 | id wraps |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
echo
python3 - "${rps_of[ig_memory]}" "${rps_of[ig_memory_bound]}" <<'PY'
import sys
empty, bound = map(float, sys.argv[1:3])
print(f"ratio memory store at its bound / empty: {bound/empty:.2f} (target >= 0.9)")
PY
[ "${ONLY:-}" = memory ] && exit 0
echo
python3 - "${rps_of[proxy]}" "${rps_of[proxy_copies]}" "${rps_of[ig_first]}" "${rps_of[ig_half]}" "${rps_of[ig_copies]}" \
  "${rps_of[peer_first]:-0}" "${rps_of[peer_half]:-0}" "${rps_of[peer_copies]:-0}" "${rps_of[ig_file]}" "$peer_skip" "$DUP_SHARE" "$COPY_SHARE" <<'PY'
import sys
p, pc, f, h, c, pf, ph, pcp, fs = map(float, sys.argv[1:10])
skip, dup, copies = sys.argv[10:]
print(f"ratio idemgate / nginx-proxy: first deliveries {f/p:.2f} (target >= 0.6), {dup} duplicates {h/p:.2f} (target >= 0.75), {copies} duplicates {c/pc:.2f} (target >= 1.0)")
print(f"ratio file store / Redis store, first deliveries: {fs/f:.2f} (target >= 0.7)")
if skip:
    print(f"ratio idemgate / peer: skipped ({skip})")
else:
    print(f"ratio idemgate / peer: first deliveries {f/pf:.2f} (target >= 1.8), {dup} duplicates {h/ph:.2f}, {copies} duplicates {c/pcp:.2f}")
PY
echo
echo "file store directory: ${FILE_STORE_DISK:-?}"
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
