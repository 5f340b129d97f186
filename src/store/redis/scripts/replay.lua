-- An operator's replay: a forced claim, the one claim that still needs a script (rare).
-- KEYS[1] claim record, KEYS[2] lock, KEYS[3] log hash (same hash tag, so one slot)
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] payload fingerprint (hex),
-- ARGV[4] now (unix ms), ARGV[5] retention ms, ARGV[6..9] the kept request (method,
-- path, headers, body), optional. The recent index keeps the delivery where its
-- first claim put it (log_writer.rs): a replay does not move it.
-- Returns {'claimed'} | {'in_flight', remaining lease ms} | {'mismatch'} | {'queued'}
--
-- A completed record (`c|fp|answer`) is not replaced: the replay takes the lock and
-- marks the record `r` (replaying), keeping the old answer. Copies meanwhile are
-- answered 409 while the lock lives; once it is released or lapses without a new
-- answer, the record answers with its old one (record.rs). A released key (no record)
-- is re-claimed as a first delivery would be, if its log still holds the fingerprint
-- the operator read.
local rec = redis.call('GET', KEYS[1])
local tag = rec and string.sub(rec, 1, 1)
local function fp_of(r)
  if string.sub(r, 1, 1) == 'p' then
    return string.sub(r, 36)
  end
  return string.match(r, '^.|([^|]*)')
end
if rec and fp_of(rec) ~= '' and fp_of(rec) ~= ARGV[3] then
  return {'mismatch'}
end
if tag == 'p' then
  -- A retried claim (its first reply lost) finds its own token: it owns the key.
  if string.sub(rec, 1, 35) == 'p|' .. ARGV[1] .. '|' then
    return {'claimed'}
  end
  return {'in_flight', redis.call('PTTL', KEYS[1])}
end
if tag == 'q' then
  return {'queued'}
end
if tag == 'c' or tag == 'r' then
  if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if redis.call('GET', KEYS[2]) == ARGV[1] then
      return {'claimed'}
    end
    return {'in_flight', redis.call('PTTL', KEYS[2])}
  end
  if tag == 'c' then
    redis.call('SETRANGE', KEYS[1], 0, 'r')
  end
  -- The old answer is kept for a whole retention from the replay (and at least the
  -- lease; renew.lua keeps it so), whether the replay records a new one or not: a
  -- key about to expire is not left to lapse right after a failed replay.
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[5]), tonumber(ARGV[2])))
else
  -- No record: released, or a key of the earlier layout (state in the log hash's
  -- `status`, its claim in the lock; claim.rs): a completed one is replayed as above.
  local old = redis.call('HMGET', KEYS[3], 'fp', 'status', 'resp_status', 'resp_headers',
    'resp_body', 'restore')
  if old[1] ~= ARGV[3] then
    return {'mismatch'}
  end
  if old[2] == 'queued' then
    return {'queued'}
  end
  if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return {'in_flight', redis.call('PTTL', KEYS[2])}
  end
  if old[3] and (old[2] == 'completed' or (old[2] == 'processing' and old[6] == '1')) then
    local h = old[4] or ''
    redis.call('SET', KEYS[1], 'r|' .. ARGV[3] .. '|' .. old[3] .. '|' .. #h .. '|' .. h
      .. (old[5] or ''), 'PX', math.max(tonumber(ARGV[5]), tonumber(ARGV[2])))
  else
    redis.call('DEL', KEYS[2])
    redis.call('SET', KEYS[1], 'p|' .. ARGV[1] .. '|' .. ARGV[3], 'PX', ARGV[2])
  end
end
local f = {'fp', ARGV[3], 'last_seen', ARGV[4]}
if ARGV[6] then
  for _, v in ipairs({'req_method', ARGV[6], 'req_path', ARGV[7],
      'req_headers', ARGV[8], 'req_body', ARGV[9]}) do
    f[#f + 1] = v
  end
end
redis.call('HSET', KEYS[3], unpack(f))
redis.call('HINCRBY', KEYS[3], 'attempts', 1)
redis.call('HINCRBY', KEYS[3], 'replays', 1)
redis.call('PEXPIRE', KEYS[3], math.max(tonumber(ARGV[5]), tonumber(ARGV[2])))
return {'claimed'}
