-- wrk script: sends the pre-signed deliveries of gen_requests.py, one list per thread.
-- IDEMGATE_LOAD_DIR names the folder; the results line is parsed by run.sh.
local dir = os.getenv("IDEMGATE_LOAD_DIR")
local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  entries = {}
  ts = nil
  for line in io.lines(dir .. "/data_" .. tid .. ".txt") do
    if ts == nil then
      ts = line
    else
      local id, sig = line:match("^(%S+) (%S+)$")
      entries[#entries + 1] = { id, sig }
    end
  end
  local f = io.open(dir .. "/body.txt", "rb")
  body = f:read("*a")
  f:close()
  i = 0
  wrapped = 0
  n = #entries
  hdrs = { ["content-type"] = "application/json", ["webhook-timestamp"] = ts }
end

function request()
  i = i + 1
  if i > n then
    i = 1
    wrapped = wrapped + 1
  end
  local e = entries[i]
  hdrs["webhook-id"] = e[1]
  hdrs["webhook-signature"] = e[2]
  return wrk.format("POST", "/webhooks/load", hdrs, body)
end

function done(summary, latency, requests)
  local wraps = 0
  for _, t in ipairs(threads) do
    wraps = wraps + (t:get("wrapped") or 0)
  end
  io.write(string.format("RESULT requests=%d duration_us=%d non2xx=%d socket_errors=%d p50_us=%d p99_us=%d wrapped=%d\n",
    summary.requests, summary.duration, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50), latency:percentile(99), wraps))
end
