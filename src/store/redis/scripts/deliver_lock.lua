-- A queue worker's check-and-set before forwarding: at most one holder per key, so
-- two workers racing over a taken-over entry never forward it concurrently.
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash; ARGV[1] worker token,
-- ARGV[2] lease ms, ARGV[3] now (unix ms), ARGV[4] how long the record lives (ms): the
-- longer of retention and the route's max_age, so it outlives every attempt the entry
-- may get, ARGV[5] the queue entry's ID: attempts are counted per entry, each in its
-- own field `attempts:<ID>` (a redriven dead letter is a new entry and starts again at
-- 1, and two entries of one key taking turns never reset each other's count);
-- `delivery_entry` and `delivery_attempts` show the entry that took the lock last
-- Returns {'completed'} | {'busy'} | {'claimed', attempt number}
-- A replay of a completed key whose lock is gone (`r`, record.rs) is completed too.
local rec = redis.call('GET', KEYS[1])
local tag = rec and string.sub(rec, 1, 1)
if tag == 'c' or tag == 'C' or (tag == 'r' and redis.call('EXISTS', KEYS[2]) == 0) then
  return {'completed'}
end
if tag == 'p' or tag == 'P' then
  return {'busy'}
end
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then
    return {'busy'}
  end
end
-- The record lives as long as the entry may be delivered; one that lapsed (or was
-- forgotten) while queued is re-created: copies are acknowledged again.
if not rec then
  redis.call('SET', KEYS[1], 'q|' .. (redis.call('HGET', KEYS[3], 'fp') or ''), 'PX', ARGV[4])
elseif tag == 'q' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
redis.call('HSETNX', KEYS[3], 'first_seen', ARGV[3])
local field = 'attempts:' .. ARGV[5]
local n = redis.call('HINCRBY', KEYS[3], field, 1)
-- An entry counted in the earlier layout (one count per key, mid-retry during a
-- rolling upgrade) keeps its count. Wherever `delivery_entry` names this entry,
-- `delivery_attempts` equals its field (both are set together, here and in
-- deliver_unlock.lua), so adding it to a fresh field adds 0 in this layout.
if n == 1 and redis.call('HGET', KEYS[3], 'delivery_entry') == ARGV[5] then
  n = redis.call('HINCRBY', KEYS[3], field,
    tonumber(redis.call('HGET', KEYS[3], 'delivery_attempts') or '0') or 0)
end
redis.call('HSET', KEYS[3], 'last_seen', ARGV[3], 'delivery_entry', ARGV[5],
  'delivery_attempts', n)
redis.call('PEXPIRE', KEYS[3], ARGV[4])
return {'claimed', n}
