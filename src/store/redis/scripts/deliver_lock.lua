-- A queue worker's check-and-set before forwarding: at most one holder per key, so
-- two workers racing over a taken-over entry never forward it concurrently.
-- KEYS[1] state hash, KEYS[2] lock; ARGV[1] worker token, ARGV[2] lease ms,
-- ARGV[3] now (unix ms), ARGV[4] how long the status lives (ms): the longer of
-- retention and the route's max_age, so it outlives every attempt the entry may get,
-- ARGV[5] the queue entry's ID: attempts are counted per entry (a redriven dead
-- letter is a new entry and starts again at 1)
-- Returns {'completed'} | {'busy'} | {'claimed', attempt number}
-- An operator's replay of a completed key whose claim lapsed unsettled (`restore`, see
-- claim.lua) leaves the key completed with its old answer, for workers too.
local s = redis.call('HMGET', KEYS[1], 'status', 'restore', 'resp_status')
if s[1] == 'completed' or (s[1] == 'processing' and s[2] == '1' and s[3]
    and redis.call('EXISTS', KEYS[2]) == 0) then
  return {'completed'}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return {'busy'}
  end
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'last_seen', ARGV[3])
redis.call('HSETNX', KEYS[1], 'first_seen', ARGV[3])
if redis.call('HGET', KEYS[1], 'delivery_entry') ~= ARGV[5] then
  redis.call('HSET', KEYS[1], 'delivery_entry', ARGV[5], 'delivery_attempts', 0)
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'claimed', redis.call('HINCRBY', KEYS[1], 'delivery_attempts', 1)}
