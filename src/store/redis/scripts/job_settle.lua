-- Records a job item's outcome and counts it, once per item.
-- KEYS[1] the job's hash, KEYS[2] its item marks; ARGV[1] item, ARGV[2] '1' when it
-- succeeded, ARGV[3] error
local was = redis.call('HGET', KEYS[2], ARGV[1])
if was and was ~= 'started' then
  return 0
end
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], 'ok')
  redis.call('HINCRBY', KEYS[1], 'done', 1)
else
  redis.call('HSET', KEYS[2], ARGV[1], 'failed:' .. ARGV[3])
  redis.call('HINCRBY', KEYS[1], 'failed', 1)
  redis.call('HSET', KEYS[1], 'error', ARGV[3])
end
return 1
