-- Moves an exhausted entry to the dead-letter stream, atomically (the queue and the
-- dead-letter stream share the route's hash tag, so one slot).
-- KEYS[1] queue, KEYS[2] dead-letter stream; ARGV[1] group, ARGV[2] entry ID,
-- ARGV[3..] field, value, ... of the dead-letter entry
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return id
