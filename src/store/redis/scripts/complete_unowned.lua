-- Records a completed delivery's answer for a caller whose claim is gone (its lease
-- lapsed, or a failover lost the claim record): the application has answered 2xx,
-- so the answer is kept unless someone else holds the key now (fencing).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash
-- ARGV[1] the payload's fingerprint (hex), ARGV[2..8] as complete.lua's.
-- Returns 1 when this call recorded the answer, 2 when the record already holds a
-- completion of this payload (rewritten in place, so a following WAIT has a write
-- to confirm), 0 when another claimer, a replay, a queue worker or another payload
-- holds the key: nothing is written.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local rec = redis.call('GET', KEYS[1])
if rec then
  if string.sub(rec, 1, 2) ~= 'c|' then
    return 0
  end
  local fp = string.match(rec, '^c|([^|]*)|')
  if fp ~= '' and fp ~= ARGV[1] then
    return 0
  end
  redis.call('SET', KEYS[1], rec, 'KEEPTTL')
  return 2
end
redis.call('SET', KEYS[1], 'c|' .. ARGV[1] .. ARGV[2], 'PX', ARGV[5])
if ARGV[6] then
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4], 'outcome', ARGV[6], 'up_status', ARGV[7], 'latency_ms', ARGV[8])
else
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4])
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
