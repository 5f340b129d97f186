-- Puts a dead letter back in the queue, atomically: a new entry (without attempts,
-- last_error, dead_at) whose received_at is now, so max_age counts from the redrive,
-- and the dead letter deleted. The key's attempts are counted per entry (see
-- deliver_lock.lua), so the new entry starts at attempt 1 with nothing to reset on
-- the key, which lives in another slot.
-- An ordered entry joins the end of its order value's list: it is delivered after the
-- deliveries of its order value accepted before the redrive.
-- KEYS[1] queue, KEYS[2] dead-letter stream, KEYS[3] the order list (absent when
-- unordered); ARGV[1] dead-letter entry ID, ARGV[2] now (unix ms)
-- Returns the new queue entry ID, or false when there is no such dead letter.
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then
  return false
end
local fields = found[1][2]
local out = {}
for i = 1, #fields, 2 do
  local f = fields[i]
  if f == 'received_at' then
    out[#out + 1] = f
    out[#out + 1] = ARGV[2]
  elseif f ~= 'attempts' and f ~= 'last_error' and f ~= 'dead_at' then
    out[#out + 1] = f
    out[#out + 1] = fields[i + 1]
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(out))
redis.call('XDEL', KEYS[2], ARGV[1])
if KEYS[3] then
  redis.call('RPUSH', KEYS[3], id)
end
return id
