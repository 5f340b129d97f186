-- The atomic claim of one delivery key: one round trip, no check-then-write.
-- KEYS[1] state hash, KEYS[2] lock (same hash tag, so one slot)
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] payload fingerprint,
-- ARGV[4] now (unix ms), ARGV[5] retention ms
-- Returns {'claimed'} | {'completed', status, headers, body} |
--         {'in_flight', remaining lease ms} | {'mismatch'} | {'queued'}
-- Delivery log (issue 8), all optional: KEYS[3] the route's recent index (absent on
-- Redis Cluster, where it would be a second slot), ARGV[6] index cap, ARGV[7] the
-- delivery's key (index member), ARGV[8] '1' = an operator's replay (a forced
-- re-claim of a completed key), ARGV[9..12] the kept request: method, path, headers, body
--
-- Every redis.call from Lua costs about as much as the command itself (argument and
-- reply conversion), and this script runs for every delivery and every copy: one
-- HMGET reads all that any branch needs, one HSET writes all it changes
-- (BENCHMARKS.md, "What holds the figures").
local forced = ARGV[8] == '1'
local s = redis.call('HMGET', KEYS[1], 'status', 'fp', 'attempts', 'first_seen',
  'duplicates', 'replays', 'resp_status', 'resp_headers', 'resp_body')
-- The recent index, scored by the last claim or copy. Trimmed when a member is added
-- (nothing else grows it). Its lifetime is renewed whenever a member is added and
-- whenever the claim gives the hash a new lifetime (`renews`), to retention + lease:
-- the completion, which leaves the index alone, renews the hash's retention when the
-- upstream call ends (by default within upstream_timeout, 10 s, well inside a 30 s
-- lease), so the index outlives the deliveries it lists. A copy renews neither.
local function log_recent(renews)
  if not KEYS[3] then
    return
  end
  local added = redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7]) == 1
  if added then
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[6]) - 1)
  end
  if added or renews then
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]) + tonumber(ARGV[2]))
  end
end
local function copy_seen()
  redis.call('HSET', KEYS[1], 'duplicates', (tonumber(s[5]) or 0) + 1, 'last_seen', ARGV[4])
  log_recent(false)
end
if s[1] == 'completed' and not forced then
  if s[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  copy_seen()
  return {'completed', s[7], s[8], s[9]}
end
-- An async route's delivery in its queue (or in delivery): copies get the ack again.
if s[1] == 'queued' then
  if s[2] and s[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  copy_seen()
  return {'queued'}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = {'status', 'processing', 'fp', ARGV[3], 'last_seen', ARGV[4],
    'first_seen', s[4] or ARGV[4], 'attempts', (tonumber(s[3]) or 0) + 1}
  if ARGV[9] then
    for _, v in ipairs({'req_method', ARGV[9], 'req_path', ARGV[10],
        'req_headers', ARGV[11], 'req_body', ARGV[12]}) do
      f[#f + 1] = v
    end
  end
  if forced then
    f[#f + 1] = 'replays'
    f[#f + 1] = (tonumber(s[6]) or 0) + 1
  end
  redis.call('HSET', KEYS[1], unpack(f))
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  log_recent(true)
  return {'claimed'}
end
-- A retried claim (the first attempt ran but its reply was lost: a dropped connection,
-- a cluster client resending after a failover) finds its own token: it owns the key.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {'claimed'}
end
if s[2] and s[2] ~= ARGV[3] then
  return {'mismatch'}
end
return {'in_flight', redis.call('PTTL', KEYS[2])}
