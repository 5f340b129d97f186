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
-- Delivery log (issue 8), optional: ARGV[7] outcome, ARGV[8] upstream status,
-- ARGV[9] latency ms; KEYS[3] the recent index (not on Cluster), ARGV[10] the
-- delivery's key, ARGV[11] index cap
if ARGV[7] then
  redis.call('HSET', KEYS[1], 'outcome', ARGV[7], 'up_status', ARGV[8], 'latency_ms', ARGV[9])
end
if KEYS[3] then
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[10])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[11]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[6])
end
return 1
