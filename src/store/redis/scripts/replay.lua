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
  if string.upper(string.sub(r, 1, 1)) == 'P' then
    return string.sub(r, 36)
  end
  return string.match(r, '^.|([^|]*)')
end
if rec and fp_of(rec) ~= '' and fp_of(rec) ~= ARGV[3] then
  return {'mismatch'}
end
if tag == 'p' or tag == 'P' then
  -- A retried claim (its first reply lost) finds its own token: it owns the key.
  if string.sub(rec, 3, 35) == ARGV[1] .. '|' then
    return {'claimed'}
  end
  return {'in_flight', redis.call('PTTL', KEYS[1])}
end
if tag == 'q' then
  return {'queued'}
end
if tag == 'c' or tag == 'r' or tag == 'C' then
  if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
    if redis.call('GET', KEYS[2]) == ARGV[1] then
      return {'claimed'}
    end
    return {'in_flight', redis.call('PTTL', KEYS[2])}
  end
  if tag == 'C' then
    -- The record's log fields (record.rs) move into the hash, with the claim's
    -- attempt; the record becomes `r` of the earlier layout, the same answer.
    local fp, first, last, outcome, up, latency, at = string.match(rec,
      '^C|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|()')
    local answer = string.sub(rec, at)
    redis.call('HSETNX', KEYS[3], 'first_seen', first)
    redis.call('HSET', KEYS[3], 'last_seen', last, 'resp_status', string.match(answer, '^[^|]*'))
    if outcome ~= '' then
      redis.call('HSET', KEYS[3], 'outcome', outcome, 'up_status', up, 'latency_ms', latency)
    end
    redis.call('HINCRBY', KEYS[3], 'attempts', 1)
    redis.call('SET', KEYS[1], 'r|' .. fp .. '|' .. answer)
  elseif tag == 'c' then
    redis.call('SETRANGE', KEYS[1], 0, 'r')
  end
  -- The old answer is kept for a whole retention from the replay (and at least the
  -- lease; renew.lua keeps it so), whether the replay records a new one or not: a
  -- key about to expire is not left to lapse right after a failed replay.
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[5]), tonumber(ARGV[2])))
else
  -- No record: released (the hash holds the fingerprint the release moved there) or
  -- gone. A released key is re-claimed as a first delivery, in the earlier layout
  -- (`p`): this attempt is counted in the hash below.
  if redis.call('HGET', KEYS[3], 'fp') ~= ARGV[3] then
    return {'mismatch'}
  end
  if redis.call('EXISTS', KEYS[2]) == 1 then
    return {'in_flight', redis.call('PTTL', KEYS[2])}
  end
  redis.call('SET', KEYS[1], 'p|' .. ARGV[1] .. '|' .. ARGV[3], 'PX', ARGV[2])
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
