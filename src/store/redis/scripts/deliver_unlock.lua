-- A failed delivery attempt gives its claim up; the key stays queued for the next
-- attempt. Owner only (fencing). With a refund the attempt is not counted: the
-- application asked the route to wait (Retry-After), which is not a failure.
-- KEYS[1] lock, KEYS[2] log hash; ARGV[1] worker token, ARGV[2] '1' to refund
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if ARGV[2] == '1' and tonumber(redis.call('HGET', KEYS[2], 'delivery_attempts') or '0') > 0 then
  redis.call('HINCRBY', KEYS[2], 'delivery_attempts', -1)
end
return 1
