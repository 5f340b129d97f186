#!/usr/bin/env bash
# Quick profiling probe (BENCHMARKS.md, "What holds the figures"): redis-server, an nginx
# upstream (one worker) and idemgate on free loopback ports, a 5 s wrk run of first
# deliveries; prints req/s, the CPU ticks of idemgate, redis-server and the upstream and
# the machine's idle ticks.
#   cargo build --profile dist && benches/load/probe.sh
# Switches: BIN= another idemgate binary; LOG= its IDEMGATE_LOG (info); DUP= share of
# duplicates (0); CONNS= wrk connections (32); NOSTORE=1 the memory store; RPIN=/IPIN=
# a prefix for redis-server/idemgate (e.g. "taskset -c 1"); WT= idemgate's
# worker_threads (1); MODE=async the route in async mode (then also prints how many of
# the accepted deliveries were still queued at the end); PERF=1 a profile in
# $OUT/perf.data (PERF_F= frequency, PERF_CG= call-graph option); SYSC=1 syscall and
# context-switch counts; STRACE=1 strace -c; STATS=1 Redis INFO commandstats.
# OUT (/tmp/prof) keeps what the switches record.
set -u
cd "$(dirname "$0")/../.."
. benches/load/lib.sh
OUT=${OUT:-/tmp/prof}; mkdir -p "$OUT"
ticks() { awk '{print $14+$15}' /proc/"$1"/stat; }

REDIS_PORT=$(free_port)
${RPIN:-} redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
RP=$!; pids+=($RP); wait_port "$REDIS_PORT"
NGINX_WORKERS=1 start_upstream
IG_PORT=$(free_port); IG_ADMIN=$(free_port)
store_url="redis://127.0.0.1:$REDIS_PORT/0"; [ -n "${NOSTORE:-}" ] && store_url=""
idemgate_config "$work/ig.toml" "$IG_PORT" "$IG_ADMIN" "$store_url"
[ -n "${WT:-}" ] && sed -i "1i worker_threads = $WT" "$work/ig.toml"
[ "${MODE:-sync}" = async ] && echo 'mode = "async"' >>"$work/ig.toml"
IDEMGATE_LOG=${LOG:-info} ${IPIN:-} ${BIN:-target/$PROFILE/idemgate} run --config "$work/ig.toml" 2>/dev/null &
IP=$!; pids+=($IP); wait_port "$IG_ADMIN"
python3 benches/load/gen_requests.py "$work/fresh" 2 150000 "${DUP:-0}" "$SECRET"

UPW=$(pgrep -P "$(cat "$work/nginx-upstream/nginx.pid")" | head -1)
t0i=$(ticks $IP); t0r=$(ticks $RP); t0n=$(ticks "$UPW"); idle0=$(awk '/^cpu /{print $5+$6}' /proc/stat)
if [ -n "${SYSC:-}" ]; then perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,context-switches' -p $IP -o "$OUT/sysc.txt" -- sleep 5 & SC=$!; fi
if [ -n "${STRACE:-}" ]; then timeout -s INT 3 strace -c -f -p $IP -o "$OUT/strace.txt" & SP=$!; fi
if [ -n "${PERF:-}" ]; then perf record -F "${PERF_F:-2000}" -e cpu-clock ${PERF_CG:--g} -p $IP -o "$OUT/perf.data" -- sleep 4 >/dev/null 2>&1 & PF=$!; fi
IDEMGATE_LOAD_DIR=$work/fresh wrk -t2 -c"${CONNS:-32}" -d5s -s benches/load/deliveries.lua "http://127.0.0.1:$IG_PORT/webhooks/load" | grep RESULT
[ -n "${PERF:-}" ] && wait $PF
[ -n "${SYSC:-}" ] && { wait $SC; grep -E "syscalls|context" "$OUT/sysc.txt"; }
[ -n "${STRACE:-}" ] && { wait $SP; head -25 "$OUT/strace.txt"; }
echo "machine idle ticks (of $(( $(nproc) * 500 ))) $(( $(awk '/^cpu /{print $5+$6}' /proc/stat) - idle0 ))"
echo "cpu ticks: idemgate $(( $(ticks $IP) - t0i )) redis $(( $(ticks $RP) - t0r )) nginx-upstream $(( $(ticks "$UPW") - t0n ))"
[ -n "${STATS:-}" ] && redis-cli -p "$REDIS_PORT" info commandstats | grep -v "^#"
[ "${MODE:-sync}" = async ] && echo "still queued at the end: $(redis-cli -p "$REDIS_PORT" XLEN 'idemgate:queue:{load}')"
exit 0
