-- The cheapest fenced completion: the claim's owner records its answer, one key.
-- KEYS[1] claim record; ARGV[1] the owner's record prefix `P|<token>|` (record.rs),
-- ARGV[2] the `C` record's tail after the fingerprint (the log's fields, then the
-- answer), ARGV[3] retention ms.
-- Returns 1 when written; 0 when the record is not this owner's `P` (a lock holder,
-- a lapsed or given-up claim, an earlier layout): the caller then runs complete.lua,
-- which decides (docs/reliability.md, "Fencing").
local rec = redis.call('GET', KEYS[1])
if rec and string.sub(rec, 1, 35) == ARGV[1] then
  redis.call('SET', KEYS[1], 'C|' .. string.sub(rec, 36) .. ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
