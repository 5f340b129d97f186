-- Records a completed delivery's answer for a caller whose claim is gone (its lease
-- lapsed, or a failover lost the claim record): the application has answered 2xx,
-- so the answer is kept unless someone else holds the key now (fencing).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash
-- ARGV[1] the payload's fingerprint (hex), ARGV[2..8] as complete.lua's. The record
-- becomes `c` (the earlier layout: its log fields in the hash).
-- Returns 1 when this call recorded the answer, 2 when the record already holds a
-- completion of this payload (rewritten in place, so a following WAIT has a write
-- to confirm), 0 when another claimer, a replay, a queue worker or another payload
-- holds the key: nothing is written.
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 0
end
local rec = redis.call('GET', KEYS[1])
if rec then
  local fp = string.match(rec, '^[cC]|([^|]*)|')
  if not fp then
    return 0
  end
  if fp ~= '' and fp ~= ARGV[1] then
    return 0
  end
  redis.call('SET', KEYS[1], rec, 'KEEPTTL')
  return 2
end
redis.call('SET', KEYS[1], 'c|' .. ARGV[1] .. ARGV[2], 'PX', ARGV[5])
-- The lapsed `P` record carried this claim's attempt and time (record.rs): the hash
-- keeps them now, the time as near as the completion knows it (now - latency).
redis.call('HSETNX', KEYS[3], 'fp', ARGV[1])
redis.call('HSETNX', KEYS[3], 'first_seen',
  string.format('%.0f', tonumber(ARGV[4]) - (tonumber(ARGV[8] or '0') or 0)))
redis.call('HINCRBY', KEYS[3], 'attempts', 1)
if ARGV[6] then
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4], 'outcome', ARGV[6], 'up_status', ARGV[7], 'latency_ms', ARGV[8])
else
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4])
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
