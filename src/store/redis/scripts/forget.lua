-- Forgets a delivery (an operator's `forget`): the provider's next copy is forwarded.
-- Refused while a live claim holds the key, which would let a copy run beside it.
-- KEYS[1] state hash, KEYS[2] lock. Returns 'forgotten' | 'not_found' | 'in_flight'
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 'in_flight'
end
if redis.call('DEL', KEYS[1]) == 1 then
  return 'forgotten'
end
return 'not_found'
