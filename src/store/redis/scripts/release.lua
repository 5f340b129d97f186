-- Gives a claim up so the provider's next copy is forwarded; owner only (fencing).
-- KEYS[1] state hash, KEYS[2] lock; ARGV[1] owner token, ARGV[2] now (unix ms)
-- An operator's replay of a completed key (`restore` = '1', see claim.lua) is not
-- released: the key goes back to `completed` with its old answer, whichever release
-- gives the claim up (a failed replay, or an under-replicated claim's plain release).
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
local s = redis.call('HMGET', KEYS[1], 'status', 'restore', 'resp_status')
-- The hash outlives the lock (claim.lua, renew.lua); one gone anyway (evicted) is not
-- re-created, which would leave a key without a TTL: the next copy claims afresh.
if not s[1] then
  return 1
end
-- Delivery log, optional: ARGV[3] outcome, ARGV[4] upstream status ('' when
-- none), ARGV[5] latency ms, ARGV[6] '1' = put a completed key back to completed (a
-- failed operator replay: the original answer stands); KEYS[3] the recent index (not
-- on Cluster), ARGV[7] the delivery's key, ARGV[8] index cap, ARGV[9] the index's
-- lifetime ms (retention + lease, as the claim script sets it)
local completed = s[3] and (s[2] == '1' or ARGV[6] == '1')
local f = {'status', completed and 'completed' or 'released', 'last_seen', ARGV[2]}
if ARGV[3] then
  for _, v in ipairs({'outcome', ARGV[3], 'up_status', ARGV[4], 'latency_ms', ARGV[5]}) do
    f[#f + 1] = v
  end
end
redis.call('HSET', KEYS[1], unpack(f))
if KEYS[3] then
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[7])
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[8]) - 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[9])
end
return 1
