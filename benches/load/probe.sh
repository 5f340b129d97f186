#!/usr/bin/env bash
# Quick profiling probe (BENCHMARKS.md, "What holds the figures"): redis-server, an nginx
# upstream and idemgate on fixed loopback ports (16379, 18081, 18080/18090), a 5 s wrk run
# of first deliveries, CPU ticks of idemgate and redis-server; PERF=1 records a profile
# to /tmp/prof/perf.data; BIN= picks another idemgate binary (e.g. an older build).
#   cargo build --release && benches/load/probe.sh
set -u
cd "$(dirname "$0")/../.."
W=/tmp/prof; rm -rf $W; mkdir -p $W/ng/logs
${RPIN:-} redis-server --port 16379 --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 &
RP=$!
cat > $W/ng/nginx.conf <<C
worker_processes 1; pid $W/ng/nginx.pid; error_log $W/ng/logs/e.log;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $W/ng; server { listen 127.0.0.1:18081; location / { return 200 "ok"; } } }
C
nginx -c $W/ng/nginx.conf -p $W/ng -g 'daemon off;' &
NP=$!
cat > $W/ig.toml <<C
listen = "127.0.0.1:18080"
admin_listen = "127.0.0.1:18090"
upstream = "http://127.0.0.1:18081"
${NOSTORE:+#}[store]
${NOSTORE:+#}url = "redis://127.0.0.1:16379/0"
[[route]]
name = "load"
path = "/webhooks/load"
provider = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
C
sleep 0.5
IDEMGATE_LOG=${LOG:-info} ${IPIN:-} ${BIN:-target/release/idemgate} run --config $W/ig.toml 2>/dev/null &
IP=$!
sleep 0.5
python3 benches/load/gen_requests.py $W/fresh 2 150000 ${DUP:-0} whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
t0i=$(awk '{print $14+$15}' /proc/$IP/stat); t0r=$(awk '{print $14+$15}' /proc/$RP/stat); t0n=$(awk '{print $14+$15}' /proc/$(cat $W/ng/nginx.pid)/stat 2>/dev/null || echo 0)
idle0=$(awk '/^cpu /{print $5+$6}' /proc/stat)
if [ -n "${SYSC:-}" ]; then perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,syscalls:sys_enter_sched_yield,context-switches' -p $IP -o $W/sysc.txt -- sleep 5 & SC=$!; fi
if [ -n "${STRACE:-}" ]; then timeout -s INT 3 strace -c -f -p $IP -o $W/strace.txt & SP=$!; fi
if [ -n "${PERF:-}" ]; then perf record -F ${PERF_F:-2000} -e cpu-clock ${PERF_CG:--g} -p $IP -o $W/perf.data -- sleep 4 >/dev/null 2>&1 & PF=$!; fi
IDEMGATE_LOAD_DIR=$W/fresh wrk -t2 -c${CONNS:-32} -d5s -s benches/load/deliveries.lua http://127.0.0.1:18080/webhooks/load | grep RESULT
[ -n "${PERF:-}" ] && wait $PF
[ -n "${SYSC:-}" ] && { wait $SC; grep -E "syscalls|context" $W/sysc.txt; }
[ -n "${STRACE:-}" ] && { wait $SP; head -25 $W/strace.txt; }
echo "machine idle ticks (of $((2*500)) ) $(( $(awk '/^cpu /{print $5+$6}' /proc/stat) - idle0 ))"
echo "cpu ticks: nginx-upstream $(( $(awk '{print $14+$15}' /proc/$(pgrep -f 'nginx: worker' | head -1)/stat) ))"
echo "cpu ticks: idemgate $(( $(awk '{print $14+$15}' /proc/$IP/stat) - t0i )) redis $(( $(awk '{print $14+$15}' /proc/$RP/stat) - t0r ))"
[ -n "${STATS:-}" ] && redis-cli -p 16379 info commandstats | grep -v "^#"
kill $IP $NP $RP; wait 2>/dev/null
