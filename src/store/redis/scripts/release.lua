-- Gives a claim up so the provider's next copy is forwarded; owner only (fencing).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash; ARGV[1] owner token,
-- ARGV[2] now (unix ms), ARGV[3] retention ms
-- A first delivery's processing record is deleted (released). A lock holder's claim
-- leaves the record: an operator's replay of a completed key (`r`) goes back to `c`
-- with its old answer, whichever release gives it up (a failed replay, or an
-- under-replicated claim's plain release); a queue worker's dead-lettered key (`q`)
-- is released, so a later copy is queued again.
local rec = redis.call('GET', KEYS[1])
-- The log hash's `status` says `released` when the record goes, so a sidecar of the
-- previous release during a rolling upgrade (its claim reads that field when no
-- record exists) takes no stale `completed` or `queued` from it.
local status = 'released'
if rec and string.sub(rec, 1, 35) == 'P|' .. ARGV[1] .. '|' then
  -- The record carried the claim's log fields (record.rs): the hash keeps them now.
  redis.call('DEL', KEYS[1])
  redis.call('HSETNX', KEYS[3], 'fp', string.sub(rec, 36))
  redis.call('HSETNX', KEYS[3], 'first_seen',
    string.format('%.0f', tonumber(string.sub(rec, 3, 18), 16)))
  redis.call('HINCRBY', KEYS[3], 'attempts', 1)
elseif rec and string.sub(rec, 1, 35) == 'p|' .. ARGV[1] .. '|' then
  redis.call('DEL', KEYS[1])
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  local tag = rec and string.sub(rec, 1, 1)
  if tag == 'r' then
    redis.call('SETRANGE', KEYS[1], 0, 'c')
    status = 'completed'
  elseif tag == 'q' then
    redis.call('DEL', KEYS[1])
  elseif tag then
    status = nil
  end
else
  return 0
end
-- Delivery log, optional: ARGV[4] outcome, ARGV[5] upstream status ('' when none),
-- ARGV[6] latency ms. (The recent index keeps the delivery where its first claim put
-- it: log_writer.rs.) The log hash may not
-- exist yet (the claim's own log write is still queued, log_writer.rs) or any more
-- (evicted): written anyway, and given a TTL when it has none.
if status then
  redis.call('HSET', KEYS[3], 'status', status)
end
if ARGV[4] then
  redis.call('HSET', KEYS[3], 'last_seen', ARGV[2], 'outcome', ARGV[4],
    'up_status', ARGV[5], 'latency_ms', ARGV[6])
else
  redis.call('HSET', KEYS[3], 'last_seen', ARGV[2])
end
redis.call('PEXPIRE', KEYS[3], ARGV[3], 'NX')
return 1
