# Shared by the load scripts (sourced): a work folder and the processes started in it,
# all removed on exit; free loopback ports; waiting for a port to listen; redis-server,
# nginx, the nginx + Lua + Redis peer, and idemgate's config for the load route.

SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# wrk's and loadgen's shape, unless the caller set them.
DURATION=${DURATION:-10}
THREADS=${THREADS:-2}
CONNS=${CONNS:-32}
RATE=${RATE:-2000}
RATE_SECONDS=${RATE_SECONDS:-$DURATION}
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
# The cargo profile the scripts build and run: `dist` (fat LTO, what the image ships);
# PROFILE=release for a quicker build (thin LTO, what `cargo run --release` builds).
PROFILE=${PROFILE:-dist}

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Installs what the load scripts run (Debian's nginx-light, wrk, redis-server) when missing.
install_missing() {
  local need=()
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx-light)
  command -v wrk >/dev/null 2>&1 || need+=(wrk)
  command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
  if [ ${#need[@]} -gt 0 ]; then
    echo "installing ${need[*]}" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
  NGINX=$(command -v nginx || echo /usr/sbin/nginx)
}

# wrk over the request data in $1 (gen_requests.py) against $2; prints its RESULT line.
run_wrk() {
  IDEMGATE_LOAD_DIR="$1" wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --timeout 10s \
    -s benches/load/deliveries.lua "$2" | grep '^RESULT'
}
field() { sed -E "s/.* $2=([0-9]+).*/\1/" <<<" $1"; } # RESULT-line field-name -> value
cpu_ticks() { awk '{print $14+$15}' /proc/"$1"/stat; }
ticks_of() { local t=0 p; for p in "$@"; do t=$((t + $(cpu_ticks "$p"))); done; echo "$t"; }
per_1000() { python3 -c "print(f'{$1/$(getconf CLK_TCK)/($2/1000):.3f}')"; } # ticks requests -> CPU s / 1000

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'; }
wait_port() {
  for _ in $(seq 1 200); do
    (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2; return 1
}

# Starts a private redis-server on a free port; sets REDIS_PORT, REDIS_PID.
start_redis() {
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
  REDIS_PID=$!
  pids+=("$REDIS_PID")
  wait_port "$REDIS_PORT"
}

start_nginx() { # name port body-of-http-block [main-context lines]; NGINX_WORKERS (auto), NGINX_LOGLEVEL (warn)
  local dir="$work/nginx-$1"; mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<CONF
${4:-}
worker_processes ${NGINX_WORKERS:-auto};
pid $dir/nginx.pid;
error_log $dir/logs/error.log ${NGINX_LOGLEVEL:-warn};
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir; uwsgi_temp_path $dir; scgi_temp_path $dir;
  $3
}
CONF
  "$NGINX" -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' &
  NGINX_PID=$!
  pids+=("$NGINX_PID")
  wait_port "$2"
}

# Starts the nginx upstream answering `200 ok` on a free port; sets UP_PORT.
start_upstream() {
  UP_PORT=$(free_port)
  start_nginx upstream "$UP_PORT" "server { listen 127.0.0.1:$UP_PORT; location / { return 200 \"ok\"; } }"
}

# The peer needs Debian's nginx Lua module (with its NDK), the Redis driver and SHA-256.
LUA_MODULES=${LUA_MODULES:-/usr/lib/nginx/modules}
LUA_PEER_PACKAGES=(libnginx-mod-http-lua lua-nginx-redis lua-nginx-string)
peer_available() {
  [ -f "$LUA_MODULES/ndk_http_module.so" ] && [ -f "$LUA_MODULES/ngx_http_lua_module.so" ] &&
    [ -f /usr/share/lua/5.1/nginx/redis.lua ] && [ -f /usr/share/lua/5.1/nginx/sha256.lua ]
}

# Starts the nginx + Lua + Redis peer (benches/load/peer_lua) on a free port, in front of
# the upstream and the Redis of start_upstream/start_redis, with PEER_WORKERS (auto)
# worker processes; sets PEER_PORT, PEER_PID.
start_peer() {
  PEER_PORT=$(free_port)
  NGINX_WORKERS=${PEER_WORKERS:-${NGINX_WORKERS:-auto}} start_nginx peer "$PEER_PORT" "upstream app { server 127.0.0.1:$UP_PORT; keepalive 64; }
  lua_package_path \"$PWD/benches/load/peer_lua/?.lua;;\";
  init_by_lua_block { require(\"peer\").configure({ redis_port = $REDIS_PORT, secrets = { \"$SECRET\" } }) }
  client_max_body_size 1m; client_body_buffer_size 1m; subrequest_output_buffer_size 64k;
  server {
    listen 127.0.0.1:$PEER_PORT;
    location /_upstream/ { internal; proxy_pass http://app/; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
    location / { content_by_lua_block { require(\"peer\").handle() } }
  }" "load_module $LUA_MODULES/ndk_http_module.so;
load_module $LUA_MODULES/ngx_http_lua_module.so;"
  PEER_PID=$NGINX_PID
}

idemgate_config() { # file listen-port admin-port store-url (empty: memory store)
  {
    echo "listen = \"127.0.0.1:$2\""
    echo "admin_listen = \"127.0.0.1:$3\""
    echo "upstream = \"http://127.0.0.1:$UP_PORT\""
    if [ -n "$4" ]; then printf '[store]\nurl = "%s"\n' "$4"
    elif [ -n "${IG_MAX_MEMORY:-}" ]; then printf '[store]\nurl = "memory"\nmax_memory = "%s"\n' "$IG_MAX_MEMORY"; fi
    printf '[[route]]\nname = "load"\npath = "/webhooks/load"\nprovider = "standard"\nsecrets = ["%s"]\n' "$SECRET"
  } >"$1"
}
