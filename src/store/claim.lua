-- The atomic claim of one delivery key: one round trip, no check-then-write.
-- KEYS[1] state hash, KEYS[2] lock (same hash tag, so one slot)
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] payload fingerprint,
-- ARGV[4] now (unix ms), ARGV[5] retention ms
-- Returns {'claimed'} | {'completed', status, headers, body} |
--         {'in_flight', remaining lease ms} | {'mismatch'} | {'queued'}
local state = redis.call('HMGET', KEYS[1], 'status', 'fp')
if state[1] == 'completed' then
  if state[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  redis.call('HINCRBY', KEYS[1], 'duplicates', 1)
  redis.call('HSET', KEYS[1], 'last_seen', ARGV[4])
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
  return {'queued'}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('HSET', KEYS[1], 'status', 'processing', 'fp', ARGV[3], 'last_seen', ARGV[4])
  redis.call('HSETNX', KEYS[1], 'first_seen', ARGV[4])
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('PEXPIRE', KEYS[1], ARGV[5])
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
