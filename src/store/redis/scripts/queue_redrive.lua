-- Puts a dead letter back in the queue, atomically: a new entry (without attempts,
-- last_error, dead_at) whose received_at is now, so max_age counts from the redrive,
-- and the dead letter deleted. The key's attempts are counted per entry (see
-- deliver_lock.lua), so the new entry starts at attempt 1 with nothing to reset on
-- the key, which lives in another slot.
-- KEYS[1] queue, KEYS[2] dead-letter stream; ARGV[1] dead-letter entry ID,
-- ARGV[2] now (unix ms)
-- Returns {new queue entry ID, its order value or ''}, or false when there is no such
-- dead letter. An ordered entry's ID is appended to its order value's list by the
-- caller (its name depends on the value read here; until then the entry waits for
-- the older ones of its value in the list, or starts when there are none).
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then
  return false
end
local fields = found[1][2]
local out = {}
local order = ''
for i = 1, #fields, 2 do
  local f = fields[i]
  if f == 'received_at' then
    out[#out + 1] = f
    out[#out + 1] = ARGV[2]
  elseif f ~= 'attempts' and f ~= 'last_error' and f ~= 'dead_at' then
    if f == 'order' then
      order = fields[i + 1]
    end
    out[#out + 1] = f
    out[#out + 1] = fields[i + 1]
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(out))
redis.call('XDEL', KEYS[2], ARGV[1])
return {id, order}
