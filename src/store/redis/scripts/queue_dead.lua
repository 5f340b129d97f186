-- Moves an exhausted entry to the dead-letter stream, atomically (the queue and the
-- dead-letter stream share the route's hash tag, so one slot). An ordered entry leaves
-- its order list: the next delivery of its order value proceeds (docs/async.md).
-- KEYS[1] queue, KEYS[2] dead-letter stream, KEYS[3] the order list (absent when
-- unordered); ARGV[1] group, ARGV[2] entry ID, ARGV[3..] field, value, ... of the
-- dead-letter entry
local id = redis.call('XADD', KEYS[2], '*', unpack(ARGV, 3))
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
if KEYS[3] then
  redis.call('LREM', KEYS[3], 1, ARGV[2])
end
return id
