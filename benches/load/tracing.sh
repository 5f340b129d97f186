#!/usr/bin/env bash
# What tracing costs (docs/tracing.md, BENCHMARKS.md "Tracing"): idemgate on Redis in
# front of an nginx upstream, once per tracing setting, each driven the same way:
# wrk (THREADS, CONNS, DURATION s of fresh 1 KiB signed deliveries) for throughput and
# CPU per delivery, then loadgen at RATE req/s for RATE_SECONDS for the latency.
#
#   off        no [tracing]
#   sink-100%  every delivery traced (start_traces, sample_ratio 1.0) to an nginx sink
#   sink-10%   sample_ratio 0.1
#   refused    sample_ratio 1.0 to a port nobody listens on (every export fails at once)
#   hanging    sample_ratio 1.0 to a collector that never answers (the queue fills)
#
# The deliveries carry no traceparent, so start_traces makes idemgate start each trace.
# ROUNDS (1) repeats the five in turn, so drift hits each alike.
#
#   cargo build --profile dist --bin idemgate --example loadgen && benches/load/tracing.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-1}
. benches/load/lib.sh
install_missing
cargo build --profile "$PROFILE" --quiet --bin idemgate --example loadgen
BIN=target/$PROFILE/idemgate
LOADGEN=target/$PROFILE/examples/loadgen

start_redis
start_upstream
SINK_PORT=$(free_port)
start_nginx sink "$SINK_PORT" "server { listen 127.0.0.1:$SINK_PORT; location / { return 200; } }"
REFUSED_PORT=$(free_port)
HANG_PORT=$(free_port)
python3 -c "import socket,time;s=socket.socket();s.bind(('127.0.0.1',$HANG_PORT));s.listen(1);time.sleep(3600)" &
pids+=($!)
wait_port "$HANG_PORT"

tracing_section() { # setting -> the [tracing] lines
  case $1 in
    off) ;;
    sink-100%) printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nstart_traces = true\n' "$SINK_PORT" ;;
    sink-10%) printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nstart_traces = true\nsample_ratio = 0.1\n' "$SINK_PORT" ;;
    refused) printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nstart_traces = true\n' "$REFUSED_PORT" ;;
    hanging) printf '[tracing]\notlp_endpoint = "http://127.0.0.1:%s"\nstart_traces = true\n' "$HANG_PORT" ;;
  esac
}

rows=()
for round in $(seq 1 "$ROUNDS"); do
  # Signed afresh each round: a round takes minutes, the timestamp window is 5.
  python3 benches/load/gen_requests.py "$work/fresh" "$THREADS" "$((DURATION * 20000))" 0 "$SECRET"
  for setting in off sink-100% sink-10% refused hanging; do
    port=$(free_port); admin=$(free_port)
    redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null
    idemgate_config "$work/ig.toml" "$port" "$admin" "redis://127.0.0.1:$REDIS_PORT/0"
    tracing_section "$setting" >>"$work/ig.toml"
    IDEMGATE_LOG=warn "$BIN" run --config "$work/ig.toml" >/dev/null 2>"$work/ig.log" &
    pid=$!
    wait_port "$admin"
    t0=$(cpu_ticks "$pid")
    r=$(run_wrk "$work/fresh" "http://127.0.0.1:$port/webhooks/load")
    t1=$(cpu_ticks "$pid")
    req=$(field "$r" requests)
    rps=$(python3 -c "print(round($req/($(field "$r" duration_us)/1e6)))")
    fr=$("$LOADGEN" "http://127.0.0.1:$port/webhooks/load" "$RATE" "$RATE_SECONDS" "$SECRET")
    dropped=$(curl -s "http://127.0.0.1:$admin/metrics" | awk '/^idemgate_trace_spans_dropped_total/{d+=$2} END{print d+0}')
    kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
    rows+=("$round|$setting|$rps|$(field "$r" non2xx)|$(per_1000 $((t1 - t0)) "$req")|$(field "$fr" non2xx)|$(field "$fr" p50_us)|$(field "$fr" p99_us)|$dropped")
    echo "round $round, $setting: $rps req/s" >&2
  done
done

echo
echo "machine: $(nproc) cores; wrk -t$THREADS -c$CONNS -d${DURATION}s; loadgen ${RATE} req/s for ${RATE_SECONDS}s; 1 KiB signed deliveries, Redis store"
echo
echo "| round | tracing | req/s | non-2xx | CPU s / 1000 | fixed-rate non-2xx | p50 µs | p99 µs | spans dropped |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
