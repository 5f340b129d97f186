-- Extends a live claim's lease while its upstream call runs; owner only.
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash; ARGV[1] owner token,
-- ARGV[2] lease ms
-- A first delivery's lease is its processing record's TTL; a lock holder's is the
-- lock's, and the record under it (a replay's old answer, a queued delivery) and the
-- log hash are kept alive at least as long: a call that outlives `retention` still
-- completes (or releases) into its own record.
local rec = redis.call('GET', KEYS[1])
local owner = rec and string.sub(rec, 1, 35)
if owner == 'P|' .. ARGV[1] .. '|' or owner == 'p|' .. ARGV[1] .. '|' then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  if rec and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
else
  return 0
end
local ttl = redis.call('PTTL', KEYS[3])
if ttl ~= -2 and ttl < tonumber(ARGV[2]) then
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return 1
