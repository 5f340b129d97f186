-- Records a completed delivery's answer, only for the current owner (fencing).
-- KEYS[1] state hash, KEYS[2] lock
-- ARGV[1] owner token, ARGV[2] status, ARGV[3] headers, ARGV[4] body,
-- ARGV[5] now (unix ms), ARGV[6] retention ms
-- Delivery log, optional: ARGV[7] outcome, ARGV[8] upstream status,
-- ARGV[9] latency ms. The recent index is not touched: the claim put the delivery
-- there, and its score (the claim's time) orders it well enough for "newest first";
-- three fewer calls on every first delivery (BENCHMARKS.md, "What holds the figures").
-- The status hash outlives the lock (claim.lua, renew.lua). One gone anyway (evicted)
-- is re-created here with the answer and a TTL but no fingerprint; claim.lua answers
-- every copy of such a key with its answer.
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
if ARGV[7] then
  redis.call('HSET', KEYS[1], 'status', 'completed', 'resp_status', ARGV[2],
    'resp_headers', ARGV[3], 'resp_body', ARGV[4], 'last_seen', ARGV[5],
    'outcome', ARGV[7], 'up_status', ARGV[8], 'latency_ms', ARGV[9])
else
  redis.call('HSET', KEYS[1], 'status', 'completed', 'resp_status', ARGV[2],
    'resp_headers', ARGV[3], 'resp_body', ARGV[4], 'last_seen', ARGV[5])
end
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return 1
