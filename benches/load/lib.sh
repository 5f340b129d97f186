# Shared by the load scripts (sourced): a work folder and the processes started in it,
# all removed on exit; free loopback ports; waiting for a port to listen; redis-server,
# nginx, and idemgate's config for the load route.

SECRET="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'; }
wait_port() {
  for _ in $(seq 1 200); do
    (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "nothing listens on $1" >&2; return 1
}

# Starts a private redis-server on a free port; sets REDIS_PORT.
start_redis() {
  REDIS_PORT=$(free_port)
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save "" --appendonly no >"$work/redis.log" 2>&1 &
  pids+=($!)
  wait_port "$REDIS_PORT"
}

start_nginx() { # name port body-of-http-block; NGINX_WORKERS (auto) worker processes
  local dir="$work/nginx-$1"; mkdir -p "$dir/logs"
  cat >"$dir/nginx.conf" <<CONF
worker_processes ${NGINX_WORKERS:-auto};
pid $dir/nginx.pid;
error_log $dir/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir; uwsgi_temp_path $dir; scgi_temp_path $dir;
  $3
}
CONF
  "$NGINX" -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' &
  pids+=($!)
  wait_port "$2"
}

# Starts the nginx upstream answering `200 ok` on a free port; sets UP_PORT.
start_upstream() {
  UP_PORT=$(free_port)
  start_nginx upstream "$UP_PORT" "server { listen 127.0.0.1:$UP_PORT; location / { return 200 \"ok\"; } }"
}

idemgate_config() { # file listen-port admin-port store-url (empty: memory store)
  {
    echo "listen = \"127.0.0.1:$2\""
    echo "admin_listen = \"127.0.0.1:$3\""
    echo "upstream = \"http://127.0.0.1:$UP_PORT\""
    if [ -n "$4" ]; then printf '[store]\nurl = "%s"\n' "$4"; fi
    printf '[[route]]\nname = "load"\npath = "/webhooks/load"\nprovider = "standard"\nsecrets = ["%s"]\n' "$SECRET"
  } >"$1"
}
