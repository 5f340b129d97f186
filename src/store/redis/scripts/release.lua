-- Gives a claim up so the provider's next copy is forwarded; owner only (fencing).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash, KEYS[4] the recent index
-- (not on Cluster); ARGV[1] owner token, ARGV[2] now (unix ms)
-- A first delivery's processing record is deleted (released). A lock holder's claim
-- leaves the record: an operator's replay of a completed key (`r`) goes back to `c`
-- with its old answer, whichever release gives it up (a failed replay, or an
-- under-replicated claim's plain release); a queue worker's dead-lettered key (`q`)
-- is released, so a later copy is queued again.
local rec = redis.call('GET', KEYS[1])
if rec and string.sub(rec, 1, 35) == 'p|' .. ARGV[1] .. '|' then
  redis.call('DEL', KEYS[1])
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  local tag = rec and string.sub(rec, 1, 1)
  if tag == 'r' then
    redis.call('SETRANGE', KEYS[1], 0, 'c')
  elseif tag == 'q' then
    redis.call('DEL', KEYS[1])
  end
else
  return 0
end
-- The log hash is not re-created when gone (evicted): it would have no TTL.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
-- Delivery log, optional: ARGV[3] outcome, ARGV[4] upstream status ('' when none),
-- ARGV[5] latency ms, ARGV[6] the delivery's key, ARGV[7] index cap, ARGV[8] the
-- index's lifetime ms (retention + lease, as a claim sets it)
if ARGV[3] then
  redis.call('HSET', KEYS[3], 'last_seen', ARGV[2], 'outcome', ARGV[3],
    'up_status', ARGV[4], 'latency_ms', ARGV[5])
else
  redis.call('HSET', KEYS[3], 'last_seen', ARGV[2])
end
if KEYS[4] then
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[6])
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -tonumber(ARGV[7]) - 1)
  redis.call('PEXPIRE', KEYS[4], ARGV[8])
end
return 1
