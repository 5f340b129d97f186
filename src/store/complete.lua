-- Records a completed delivery's answer, only for the current owner (fencing).
-- KEYS[1] state hash, KEYS[2] lock
-- ARGV[1] owner token, ARGV[2] status, ARGV[3] headers, ARGV[4] body,
-- ARGV[5] now (unix ms), ARGV[6] retention ms
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'status', 'completed', 'resp_status', ARGV[2],
  'resp_headers', ARGV[3], 'resp_body', ARGV[4], 'last_seen', ARGV[5])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
