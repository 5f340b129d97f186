-- The claim -> queued transition: the owner of a fresh claim, whose delivery is now in
-- the queue, turns its processing record into `q|fp` for the delivery worker; copies
-- are acknowledged again.
-- KEYS[1] claim record, KEYS[2] log hash; ARGV[1] owner token, ARGV[2] now (unix ms),
-- ARGV[3] how long the record lives (ms): the longer of retention and the route's
-- max_age, so a copy finds it while the entry may still be delivered
-- A `P` record's log fields (record.rs) move into the hash: the claim's attempt, its
-- fingerprint and time; `q` carries none.
local rec = redis.call('GET', KEYS[1])
local owner = rec and string.sub(rec, 1, 35)
if owner == 'P|' .. ARGV[1] .. '|' then
  redis.call('HSETNX', KEYS[2], 'fp', string.sub(rec, 36))
  redis.call('HSETNX', KEYS[2], 'first_seen',
    string.format('%.0f', tonumber(string.sub(rec, 3, 18), 16)))
  redis.call('HINCRBY', KEYS[2], 'attempts', 1)
elseif owner ~= 'p|' .. ARGV[1] .. '|' then
  return 0
end
redis.call('SET', KEYS[1], 'q|' .. string.sub(rec, 36), 'PX', ARGV[3])
-- `status`: read by the previous release's claim when no record exists (a rolling
-- upgrade from it); this release does not read it.
redis.call('HSET', KEYS[2], 'status', 'queued', 'delivery_attempts', 0, 'last_seen', ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
