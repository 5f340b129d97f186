-- Refreshes a consumer's hold on its entries in hand (resets their idle time), only
-- on those it still holds: an entry another consumer took over meanwhile (this one
-- stalled longer than claim_idle) is left with that consumer.
-- KEYS[1] queue; ARGV[1] group, ARGV[2] consumer, ARGV[3..] entry IDs
-- Returns how many entries were refreshed.
local kept = 0
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept = kept + 1
  end
end
return kept
