-- Holds a route's deliveries for ARGV[1] ms from now (this server's clock); a longer
-- hold already in place stays. KEYS[1] the route's pacing hash.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = now + tonumber(ARGV[1])
local cur = tonumber(redis.call('HGET', KEYS[1], 'hold_until') or '') or 0
if untl > cur then
  redis.call('HSET', KEYS[1], 'hold_until', untl)
end
return untl
