-- Gives a claim up so the provider's next copy is forwarded; owner only (fencing).
-- KEYS[1] state hash, KEYS[2] lock; ARGV[1] owner token, ARGV[2] now (unix ms)
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'status', 'released', 'last_seen', ARGV[2])
-- Delivery log (issue 8), optional: ARGV[3] outcome, ARGV[4] upstream status ('' when
-- none), ARGV[5] latency ms, ARGV[6] '1' = put a completed key back to completed (a
-- failed operator replay: the original answer stands); KEYS[3] the recent index (not
-- on Cluster), ARGV[7] the delivery's key, ARGV[8] index cap, ARGV[9] the index's
-- lifetime ms (retention + lease, as the claim script sets it)
if ARGV[3] then
  redis.call('HSET', KEYS[1], 'outcome', ARGV[3], 'up_status', ARGV[4], 'latency_ms', ARGV[5])
  if ARGV[6] == '1' and redis.call('HEXISTS', KEYS[1], 'resp_status') == 1 then
    redis.call('HSET', KEYS[1], 'status', 'completed')
  end
end
if KEYS[3] then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[7])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[8]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
return 1
