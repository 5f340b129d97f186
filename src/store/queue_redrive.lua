-- Puts a dead letter back in the queue (without its attempts, last_error, dead_at)
-- and deletes it from the dead-letter stream, atomically.
-- KEYS[1] queue, KEYS[2] dead-letter stream; ARGV[1] dead-letter entry ID
-- Returns {new queue entry ID, key}, or false when there is no such dead letter.
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then
  return false
end
local fields = found[1][2]
local out = {}
local key = ''
for i = 1, #fields, 2 do
  local f = fields[i]
  if f ~= 'attempts' and f ~= 'last_error' and f ~= 'dead_at' then
    out[#out + 1] = f
    out[#out + 1] = fields[i + 1]
  end
  if f == 'key' then
    key = fields[i + 1]
  end
end
local id = redis.call('XADD', KEYS[1], '*', unpack(out))
redis.call('XDEL', KEYS[2], ARGV[1])
return {id, key}
