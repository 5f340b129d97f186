-- A redriven delivery's key goes back to queued with a fresh attempt count (unless it
-- completed meanwhile). KEYS[1] state hash; ARGV[1] now (unix ms), ARGV[2] retention ms
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'completed' then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'delivery_attempts', 0, 'last_seen', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
