-- Extends a live claim's lease while its upstream call runs; owner only.
-- KEYS[1] lock; ARGV[1] owner token, ARGV[2] lease ms
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
