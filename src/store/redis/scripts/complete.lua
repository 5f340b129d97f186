-- Records a completed delivery's answer, only for the current owner (fencing): the
-- full completion, run when complete_owner.lua answered 0 (a lock holder: an
-- operator's replay, a queue worker; or a claim of the previous layout).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash
-- ARGV[1] owner token, ARGV[2] the record's tail after the fingerprint
-- ('|status|headers length|headers body', record.rs), ARGV[3] status, ARGV[4] now
-- (unix ms), ARGV[5] retention ms
-- Delivery log, optional: ARGV[6] outcome, ARGV[7] upstream status, ARGV[8] latency ms.
-- The owner is the token in a processing record (`p|token|fp`, the previous layout)
-- or the lock's. The record becomes `c|fp|answer` for `retention` (its log fields in
-- the hash); copies read it with a plain `SET … NX GET`. A record gone under a lock
-- holder (expired while queued) is re-created without a fingerprint: it answers every
-- copy, never forwarded twice. A lock holder's record is never `P` or `C` (replay.lua
-- and queue_mark.lua move their log fields into the hash first).
local rec = redis.call('GET', KEYS[1])
local fp
if rec and string.sub(rec, 1, 35) == 'p|' .. ARGV[1] .. '|' then
  fp = string.sub(rec, 36)
elseif redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  fp = rec and string.sub(rec, 1, 1) ~= 'p' and string.match(rec, '^.|([^|]*)') or ''
else
  return 0
end
redis.call('SET', KEYS[1], 'c|' .. fp .. ARGV[2], 'PX', ARGV[5])
-- `status`: read by the previous release's claim when no record exists (a rolling
-- upgrade from it); this release does not read it.
if ARGV[6] then
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4], 'outcome', ARGV[6], 'up_status', ARGV[7], 'latency_ms', ARGV[8])
else
  redis.call('HSET', KEYS[3], 'status', 'completed', 'resp_status', ARGV[3],
    'last_seen', ARGV[4])
end
redis.call('PEXPIRE', KEYS[3], ARGV[5])
return 1
