-- Puts a dead letter back in the queue, atomically: a new entry (without attempts,
-- last_error, dead_at) whose received_at is now, so max_age counts from the redrive,
-- and the dead letter deleted. The key's attempts are counted per entry (see
-- deliver_lock.lua), so the new entry starts at attempt 1 with nothing to reset on
-- the key, which lives in another slot. An ordered entry joins the end of its order
-- value's list in the same step (the list shares the route's hash tag, so its slot):
-- its name depends on the value read here, so a caller that did not name it (KEYS[3]
-- and ARGV[3], the value it is for) is told the value and nothing moves; the caller
-- then calls again naming it.
-- KEYS[1] queue, KEYS[2] dead-letter stream, KEYS[3] the order list (optional);
-- ARGV[1] dead-letter entry ID, ARGV[2] now (unix ms), ARGV[3] the order value of
-- KEYS[3]
-- Returns {'moved', new queue entry ID}, {'order', the order value} (nothing moved),
-- or false when there is no such dead letter; an error (nothing moved) when the list
-- cannot take the ID.
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
if order ~= '' and not (KEYS[3] and ARGV[3] == order) then
  return {'order', order}
end
local id = redis.call('XADD', KEYS[1], '*', unpack(out))
if order ~= '' then
  local pushed = redis.pcall('RPUSH', KEYS[3], id)
  if type(pushed) == 'table' and pushed.err then
    -- Undone: the dead letter stays, and the caller hears the error.
    redis.call('XDEL', KEYS[1], id)
    return pushed
  end
end
redis.call('XDEL', KEYS[2], ARGV[1])
return {'moved', id}
