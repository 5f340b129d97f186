-- Acknowledges a queue entry and deletes it, so the queue's length counts only
-- unacknowledged entries; an ordered entry leaves its order list, so the next one of
-- its order value may start. KEYS[1] queue, KEYS[2] the order list (absent when
-- unordered); ARGV[1] group, ARGV[2] entry ID
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
if KEYS[2] then
  redis.call('LREM', KEYS[2], 1, ARGV[2])
end
return redis.call('XDEL', KEYS[1], ARGV[2])
