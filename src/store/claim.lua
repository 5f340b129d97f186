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
local forced = ARGV[8] == '1'
local function log_recent()
  if KEYS[3] then
    redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7])
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[6]) - 1)
    redis.call('PEXPIRE', KEYS[3], ARGV[5])
  end
end
local state = redis.call('HMGET', KEYS[1], 'status', 'fp')
if state[1] == 'completed' and not forced then
  if state[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  redis.call('HSET', KEYS[1], 'last_seen', ARGV[4])
  log_recent()
  local r = redis.call('HMGET', KEYS[1], 'resp_status', 'resp_headers', 'resp_body')
  return {'completed', r[1], r[2], r[3]}
end
-- An async route's delivery in its queue (or in delivery): copies get the ack again.
if state[1] == 'queued' then
  if state[2] and state[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  redis.call('HSET', KEYS[1], 'last_seen', ARGV[4])
  log_recent()
  return {'queued'}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('HSET', KEYS[1], 'status', 'processing', 'fp', ARGV[3], 'last_seen', ARGV[4])
  redis.call('HSETNX', KEYS[1], 'first_seen', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
  if ARGV[9] then
    redis.call('HSET', KEYS[1], 'req_method', ARGV[9], 'req_path', ARGV[10],
      'req_headers', ARGV[11], 'req_body', ARGV[12])
  end
  if forced then
    redis.call('HINCRBY', KEYS[1], 'replays', 1)
  end
  log_recent()
  return {'claimed'}
end
-- A retried claim (the first attempt ran but its reply was lost: a dropped connection,
-- a cluster client resending after a failover) finds its own token: it owns the key.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {'claimed'}
end
if state[2] and state[2] ~= ARGV[3] then
  return {'mismatch'}
end
return {'in_flight', redis.call('PTTL', KEYS[2])}
