-- A failed delivery attempt gives its claim up; the key stays queued for the next
-- attempt. Owner only (fencing). With a refund the attempt is not counted: the
-- application asked the route to wait (Retry-After), which is not a failure.
-- The refund goes to the lock holder's entry: `delivery_entry`, which only the lock's
-- taker sets (deliver_lock.lua), so while the lock is ours it names our entry.
-- KEYS[1] lock, KEYS[2] log hash; ARGV[1] worker token, ARGV[2] '1' to refund
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
local entry = redis.call('HGET', KEYS[2], 'delivery_entry')
if ARGV[2] == '1' and entry then
  local field = 'attempts:' .. entry
  if tonumber(redis.call('HGET', KEYS[2], field) or '0') > 0 then
    redis.call('HSET', KEYS[2], 'delivery_attempts', redis.call('HINCRBY', KEYS[2], field, -1))
  end
end
return 1
