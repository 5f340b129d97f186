-- Gives a claim up so the provider's next copy is forwarded; owner only (fencing).
-- KEYS[1] state hash, KEYS[2] lock; ARGV[1] owner token, ARGV[2] now (unix ms)
if redis.call('GET', KEYS[2]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'status', 'released', 'last_seen', ARGV[2])
return 1
