-- A route's pacing state as the operator sees it. KEYS[1] the route's pacing hash,
-- KEYS[2] its concurrency slots. Returns {paused, ms the hold still lasts, slots taken}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local c = redis.call('HMGET', KEYS[1], 'paused', 'hold_until')
local hold = (tonumber(c[2] or '') or 0) - now
if hold < 0 then
  hold = 0
end
return {c[1] == '1' and 1 or 0, hold, redis.call('ZCOUNT', KEYS[2], now, '+inf')}
