-- Appends an async delivery to its route's queue, unless the queue is full. The
-- queue holds only unacknowledged entries (acknowledged ones are deleted), so its
-- length is what the bound counts; nothing is ever trimmed.
-- KEYS[1] queue stream; ARGV[1] max_queue, ARGV[2..] field, value, ...
-- Returns the entry ID, or false when full.
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then
  return false
end
return redis.call('XADD', KEYS[1], '*', unpack(ARGV, 2))
