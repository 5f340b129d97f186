-- The nginx + Lua + Redis peer of the load benchmark: what a team would write in
-- OpenResty style instead of running idemgate, for a Standard Webhooks route.
--
-- Per delivery, in nginx's content phase:
--   1. verify `webhook-signature` (`v1,<base64>` entries, HMAC-SHA256 over
--      `{webhook-id}.{webhook-timestamp}.{body}` with the `whsec_` secret) and the
--      timestamp's tolerance window: 401 otherwise (400 for a missing header);
--   2. claim the id in Redis with one `SET key "p" NX PX lease GET` (Redis >= 7.0): the
--      old value comes back when the key exists (a copy: its stored answer is replayed,
--      or 409 while the first delivery is in flight); nil means this request owns it;
--   3. forward to the upstream (a subrequest to a `proxy_pass` location with upstream
--      keep-alive);
--   4. a 2xx answer is recorded with `SET key answer PX retention` and returned; any
--      other answer deletes the claim (the sender's retry is forwarded again).
--
-- It does not do what idemgate does besides: no owner token (a completion after a lost
-- lease is not fenced), no payload fingerprint (a reused id with another body gets the
-- first answer, not 422), no lease renewal, no delivery log, metrics, queue or console.
--
-- Debian ships no HMAC for nginx's Lua, so HMAC (RFC 2104) is built here on
-- `nginx.sha256` (lua-resty-string, OpenSSL's SHA-256 through FFI); `configure` checks
-- it against RFC 4231's test vectors and refuses to start on a mismatch.

local redis = require "nginx.redis"
local sha256 = require "nginx.sha256"
local bit = require "bit"

local byte, char, rep, concat = string.byte, string.char, string.rep, table.concat
local bxor, bor = bit.bxor, bit.bor
local ngx = ngx

local _M = {}

-- Set once by `configure` (init_by_lua, before the workers fork).
local cfg

-- At most this many signature entries are examined (as idemgate).
local MAX_ENTRIES = 64

-- The HMAC-SHA256 key schedule: the key padded to SHA-256's 64-byte block, XORed with
-- the inner and outer pads; computed once per secret.
local function hmac_key(key)
  if #key > 64 then
    local h = sha256:new()
    h:update(key)
    key = h:final()
  end
  key = key .. rep("\0", 64 - #key)
  local ipad, opad = {}, {}
  for n = 1, 64 do
    local b = byte(key, n)
    ipad[n] = char(bxor(b, 0x36))
    opad[n] = char(bxor(b, 0x5c))
  end
  return { ipad = concat(ipad), opad = concat(opad) }
end

-- HMAC-SHA256 over the concatenation of the given strings (raw 32-byte digest).
local function hmac_sha256(k, ...)
  local h = sha256:new()
  h:update(k.ipad)
  for n = 1, select("#", ...) do
    h:update((select(n, ...)))
  end
  local inner = h:final()
  h:reset()
  h:update(k.opad)
  h:update(inner)
  return h:final()
end
_M.hmac_sha256 = hmac_sha256
_M.hmac_key = hmac_key

-- Compares two strings in time independent of where they differ.
local function equal(a, b)
  if #a ~= #b then
    return false
  end
  local d = 0
  for n = 1, #a do
    d = bor(d, bxor(byte(a, n), byte(b, n)))
  end
  return d == 0
end

local function from_hex(s)
  return (s:gsub("..", function(h) return char(tonumber(h, 16)) end))
end

-- RFC 4231 test cases 1, 2 and 6 (short key, short text, key longer than a block).
local VECTORS = {
  { rep("\11", 20), "Hi There",
    "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7" },
  { "Jefe", "what do ya want for nothing?",
    "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843" },
  { rep("\170", 131), "Test Using Larger Than Block-Size Key - Hash Key First",
    "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54" },
}

-- Takes the peer's settings: redis_port, secrets (`whsec_…` strings), lease_ms,
-- retention_ms, tolerance_s. Errors (so nginx does not start) if the HMAC is wrong.
function _M.configure(c)
  for i, v in ipairs(VECTORS) do
    local got = hmac_sha256(hmac_key(v[1]), v[2])
    assert(got == from_hex(v[3]), "HMAC-SHA256 fails RFC 4231 vector " .. i)
  end
  local keys = {}
  for _, s in ipairs(c.secrets) do
    local raw = ngx.decode_base64((s:gsub("^whsec_", "")))
    assert(raw and #raw > 0, "a Standard Webhooks secret is whsec_ followed by base64")
    keys[#keys + 1] = hmac_key(raw)
  end
  cfg = {
    redis_port = c.redis_port,
    keys = keys,
    lease_ms = c.lease_ms or 30000,
    retention_ms = c.retention_ms or 72 * 3600 * 1000,
    tolerance_s = c.tolerance_s or 300,
    upstream_location = c.upstream_location or "/_upstream",
  }
end

-- Ends the request with a status, a content type and a body.
local function answer(status, ctype, body, extra)
  ngx.status = status
  if ctype and ctype ~= "" then
    ngx.header["Content-Type"] = ctype
  end
  if extra then
    for k, v in pairs(extra) do
      ngx.header[k] = v
    end
  end
  ngx.header["Content-Length"] = #body
  ngx.print(body)
  return ngx.exit(ngx.HTTP_OK)
end

local function refuse(status, code, message, extra)
  return answer(status, "application/json",
    '{"error":"' .. code .. '","message":"' .. message .. '"}', extra)
end

-- Whether any `v1` entry of the signature header matches the delivery.
local function signed(id, ts, sigs, body)
  local macs
  local seen = 0
  for entry in sigs:gmatch("%S+") do
    seen = seen + 1
    if seen > MAX_ENTRIES then
      break
    end
    local version, sig = entry:match("^([^,]*),(.*)$")
    if version == "v1" then
      local raw = ngx.decode_base64(sig)
      if raw then
        if not macs then
          macs = {}
          for n, k in ipairs(cfg.keys) do
            macs[n] = hmac_sha256(k, id, ".", ts, ".", body)
          end
        end
        for n = 1, #macs do
          if equal(macs[n], raw) then
            return true
          end
        end
      end
    end
  end
  return false
end

local function read_body()
  ngx.req.read_body()
  local body = ngx.req.get_body_data()
  if body then
    return body
  end
  local file = ngx.req.get_body_file()
  if not file then
    return ""
  end
  local f = assert(io.open(file, "rb"))
  body = f:read("*a")
  f:close()
  return body
end

local function connect()
  local red = redis:new()
  red:set_timeout(1000)
  local ok, err = red:connect("127.0.0.1", cfg.redis_port)
  if not ok then
    return nil, err
  end
  return red
end

-- Back to the worker's connection pool (idle 60 s, up to 256 per worker).
local function pool(red)
  red:set_keepalive(60000, 256)
end

-- A stored answer: "<status>\n<content-type>\n<body>".
local function encode(status, ctype, body)
  return status .. "\n" .. (ctype or "") .. "\n" .. body
end

-- Handles one delivery (content_by_lua).
function _M.handle()
  local id = ngx.var.http_webhook_id
  local ts = ngx.var.http_webhook_timestamp
  local sigs = ngx.var.http_webhook_signature
  if not (id and ts and sigs) then
    return refuse(400, "bad_request", "missing webhook-id, webhook-timestamp or webhook-signature header")
  end
  local t = tonumber(ts)
  if not t then
    return refuse(400, "bad_request", "the timestamp is not an integer")
  end
  if math.abs(ngx.time() - t) > cfg.tolerance_s then
    return refuse(401, "invalid_signature", "the timestamp is outside the tolerance window")
  end
  local body = read_body()
  if not signed(id, ts, sigs, body) then
    return refuse(401, "invalid_signature", "no signature matches")
  end

  local key = "peer:load:" .. id
  local red, err = connect()
  if not red then
    ngx.log(ngx.ERR, "redis connect: ", err)
    return refuse(503, "store_unavailable", "the store cannot be reached")
  end
  local prev
  prev, err = red:set(key, "p", "NX", "PX", cfg.lease_ms, "GET")
  if err then
    ngx.log(ngx.ERR, "redis claim: ", err)
    return refuse(503, "store_unavailable", "the store cannot be reached")
  end
  if prev ~= ngx.null then
    pool(red)
    if prev == "p" then
      return refuse(409, "in_flight", "a copy of this delivery is being processed; retry later",
        { ["Retry-After"] = "1" })
    end
    local status, ctype, stored = prev:match("^(%d+)\n([^\n]*)\n(.*)$")
    return answer(tonumber(status), ctype, stored, { ["Idempotent-Replayed"] = "true" })
  end
  -- Claimed: the connection goes back to the pool while the upstream call runs.
  pool(red)

  local res = ngx.location.capture(cfg.upstream_location .. ngx.var.uri,
    { method = ngx.HTTP_POST, body = body, args = ngx.var.args })
  local ok_answer = res.status >= 200 and res.status < 300 and not res.truncated
  local ctype = res.header["Content-Type"]
  local done
  red, err = connect()
  if red then
    if ok_answer then
      done, err = red:set(key, encode(res.status, ctype, res.body), "PX", cfg.retention_ms)
    else
      done, err = red:del(key)
    end
    if not done then
      ngx.log(ngx.ERR, "redis settle: ", err)
    else
      pool(red)
    end
  else
    ngx.log(ngx.ERR, "redis connect (settle): ", err)
  end
  if res.status == 0 then
    return refuse(502, "upstream_error", "the upstream call failed")
  end
  return answer(res.status, ctype, res.body)
end

return _M
