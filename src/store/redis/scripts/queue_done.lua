-- Acknowledges a queue entry and deletes it, so the queue's length counts only
-- unacknowledged entries. KEYS[1] queue; ARGV[1] group, ARGV[2] entry ID
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
return redis.call('XDEL', KEYS[1], ARGV[2])
