-- The claim -> queued transition: the owner of a fresh claim, whose delivery is now in
-- the queue, frees the claim for the delivery worker; copies are acknowledged again.
-- KEYS[1] state hash, KEYS[2] lock; ARGV[1] owner token, ARGV[2] now (unix ms),
-- ARGV[3] how long the status lives (ms): the longer of retention and the route's
-- max_age, so a copy finds it while the entry may still be delivered
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'status', 'queued', 'delivery_attempts', 0, 'last_seen', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
