-- Forgets a delivery (an operator's `forget`): the provider's next copy is forwarded.
-- Refused while a live claim holds the key, which would let a copy run beside it.
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash.
-- Returns 'forgotten' | 'not_found' | 'in_flight'
local rec = redis.call('GET', KEYS[1])
if (rec and string.upper(string.sub(rec, 1, 1)) == 'P') or redis.call('EXISTS', KEYS[2]) == 1 then
  return 'in_flight'
end
if redis.call('DEL', KEYS[1], KEYS[3]) > 0 then
  return 'forgotten'
end
return 'not_found'
