-- A failed delivery attempt gives its claim up; the key stays queued for the next
-- attempt. Owner only (fencing). KEYS[1] lock; ARGV[1] worker token
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
return 1
