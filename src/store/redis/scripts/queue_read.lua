-- A worker's batch: acknowledges (and deletes) the unordered entries it delivered
-- since its last batch, reads new entries for it, and tells whether the route is open
-- (not paused, not held by a Retry-After; the fields pacing_admit.lua reads first), so
-- that the first attempt of an unthrottled, unordered entry read here needs no
-- admission of its own. One script per batch instead of an acknowledgement
-- (queue_done.lua) and an admission per entry. The queue and the pacing hash share
-- the route's hash tag: one slot.
-- KEYS[1] queue, KEYS[2] the route's pacing hash; ARGV[1] group, ARGV[2] consumer,
-- ARGV[3] how many entries to read (0: none), ARGV[4..] IDs of delivered entries
-- Returns {1 when open else 0, the XREADGROUP reply (false when none read)}
if #ARGV > 3 then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 4))
  redis.call('XDEL', KEYS[1], unpack(ARGV, 4))
end
local read = false
if tonumber(ARGV[3]) > 0 then
  read = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3],
    'STREAMS', KEYS[1], '>')
end
local c = redis.call('HMGET', KEYS[2], 'paused', 'hold_until')
local open = 1
if c[1] == '1' then
  open = 0
end
local hold = tonumber(c[2] or '') or 0
if hold > 0 then
  local t = redis.call('TIME')
  if hold > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    open = 0
  end
end
return {open, read}
