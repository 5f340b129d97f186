#!/usr/bin/env bash
# Fixed-rate latency of the three paths in one run (BENCHMARKS.md, "What holds the
# figures", item 12): direct to an nginx upstream, idemgate on Redis, idemgate on the
# memory store. Fixed loopback ports 16379, 18080-18092; RATE (2000) req/s for SECS (5).
#   cargo build --release --bin idemgate --example loadgen && benches/load/latency.sh
set -u
cd "$(dirname "$0")/../.."; W=/tmp/idemgate-latency; rm -rf $W; mkdir -p $W/ng/logs
redis-server --port 16379 --bind 127.0.0.1 --save "" --appendonly no >/dev/null 2>&1 & RP=$!
cat > $W/ng/nginx.conf <<C
worker_processes 1; pid $W/ng/nginx.pid; error_log $W/ng/logs/e.log;
events { worker_connections 4096; }
http { access_log off; client_body_temp_path $W/ng; server { listen 127.0.0.1:18081; location / { return 200 "ok"; } } }
C
nginx -c $W/ng/nginx.conf -p $W/ng -g 'daemon off;' & NP=$!
mk() { cat > $W/$1.toml <<C
listen = "127.0.0.1:$2"
admin_listen = "127.0.0.1:$3"
upstream = "http://127.0.0.1:18081"
$4
[[route]]
name = "load"
path = "/webhooks/load"
provider = "standard"
secrets = ["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]
C
}
mk redis 18080 18090 '[store]
url = "redis://127.0.0.1:16379/0"'
mk mem 18082 18092 ''
sleep 0.3
IDEMGATE_LOG=${LOG:-info} ${BIN:-target/release/idemgate} run --config $W/redis.toml 2>/dev/null & I1=$!
IDEMGATE_LOG=${LOG:-info} ${BIN:-target/release/idemgate} run --config $W/mem.toml 2>/dev/null & I2=$!
sleep 0.5
L=target/release/examples/loadgen; S=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
echo "direct: $($L http://127.0.0.1:18081/webhooks/load ${RATE:-2000} ${SECS:-5} $S)"
echo "redis:  $($L http://127.0.0.1:18080/webhooks/load ${RATE:-2000} ${SECS:-5} $S)"
echo "memory: $($L http://127.0.0.1:18082/webhooks/load ${RATE:-2000} ${SECS:-5} $S)"
[ -n "${STATS:-}" ] && redis-cli -p 16379 latency histogram evalsha | tr "\n" " " | head -c 1500 && echo
kill $I1 $I2 $NP $RP; wait 2>/dev/null
