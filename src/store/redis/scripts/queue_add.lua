-- Appends an async delivery to its route's queue, unless the queue is full. The
-- queue holds only unacknowledged entries (acknowledged ones are deleted), so its
-- length is what the bound counts; nothing is ever trimmed. An ordered route's entry
-- is also appended to its order value's list, in the same step, so the list's order
-- is the queue's (the order of acceptance).
-- KEYS[1] queue stream, KEYS[2] the order list (absent when unordered);
-- ARGV[1] max_queue, ARGV[2..] field, value, ...
-- Returns the entry ID, or false when full.
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return false
end
local id = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
if KEYS[2] then
  redis.call('RPUSH', KEYS[2], id)
end
return id
