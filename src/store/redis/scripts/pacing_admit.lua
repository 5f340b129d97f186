-- May one more delivery of a route start now? The route's pacing state is shared by
-- every sidecar, and its clock is this server's (TIME), so sidecars' clocks never skew
-- the bucket. KEYS[1] the route's pacing hash (paused, hold_until, tokens, tokens_at),
-- KEYS[2] its concurrency slots (sorted set: slot → expiry ms), KEYS[3] its queue,
-- KEYS[4] the order list of the entry's order value (the pacing hash when unordered).
-- ARGV[1] slot name, ARGV[2] queue entry ID ('' when unordered), ARGV[3] max
-- concurrency (0: none), ARGV[4] rate per second (0: none), ARGV[5] burst,
-- ARGV[6] slot TTL ms.
-- Returns {'go'|'paused'|'held'|'gone'|'ordered'|'busy'|'wait', ms to wait}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local c = redis.call('HMGET', KEYS[1], 'paused', 'hold_until', 'tokens', 'tokens_at')
if c[1] == '1' then
  return {'paused', 0}
end
local hold = tonumber(c[2] or '') or 0
if hold > now then
  return {'held', hold - now}
end
if ARGV[2] ~= '' then
  -- An entry no longer in the queue (another worker took it over and finished it)
  -- must not start again, in or out of its order.
  if #redis.call('XRANGE', KEYS[3], ARGV[2], ARGV[2]) == 0 then
    return {'gone', 0}
  end
  -- The oldest unfinished entry of the order value goes first. An ID whose entry is
  -- gone from the queue (finished by a crashed worker before it could be removed
  -- here) no longer holds the others.
  while true do
    local head = redis.call('LINDEX', KEYS[4], 0)
    if not head or head == ARGV[2] then
      break
    end
    if #redis.call('XRANGE', KEYS[3], head, head) > 0 then
      return {'ordered', 0}
    end
    redis.call('LPOP', KEYS[4])
  end
end
local max = tonumber(ARGV[3])
if max > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if redis.call('ZCARD', KEYS[2]) >= max then
    return {'busy', 0}
  end
end
local rate = tonumber(ARGV[4])
if rate > 0 then
  local burst = tonumber(ARGV[5])
  local tokens = tonumber(c[3] or '') or burst
  local at = tonumber(c[4] or '') or now
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
  if tokens < 1 then
    return {'wait', math.max(1, math.ceil((1 - tokens) * 1000 / rate))}
  end
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens - 1), 'tokens_at', now)
end
if max > 0 then
  redis.call('ZADD', KEYS[2], now + tonumber(ARGV[6]), ARGV[1])
  -- The set lives as long as its longest slot (sidecars may have different TTLs).
  local last = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', KEYS[2], last[2])
end
return {'go', 0}
