-- Writes a completed record again, unchanged, so that a copy answered from it can wait
-- (`WAIT`, pipelined after this script on the same connection) until the replicas hold
-- it: a record another sidecar completed is replicated on that sidecar's connection,
-- and a `WAIT` on this one would count nothing of it (confirm.rs).
-- KEYS[1] claim record; ARGV[1] the record as the copy read it.
-- Returns 1 when written again; 0 when the record is gone or no longer that value (a
-- replay, a forget, an expiry came first): the copy is then not confirmed.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl > 0 then
  -- PX, not KEEPTTL: Redis sends the write to replicas with its absolute expiry, so
  -- a replica that lacked the record gets it with the master's expiry, not forever.
  redis.call('SET', KEYS[1], ARGV[1], 'PX', pttl)
elseif pttl == -1 then
  redis.call('SET', KEYS[1], ARGV[1])
else
  return 0
end
return 1
