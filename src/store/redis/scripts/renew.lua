-- Extends a live claim's lease while its upstream call runs; owner only.
-- KEYS[1] lock, KEYS[2] state hash; ARGV[1] owner token, ARGV[2] lease ms
-- The status hash is kept alive at least as long as the lock: a call that outlives
-- `retention` still completes (or releases) into its own record, fingerprint and all.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local ttl = redis.call('PTTL', KEYS[2])
if ttl ~= -2 and ttl < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
end
return 1
