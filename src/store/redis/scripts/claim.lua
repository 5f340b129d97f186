-- The atomic claim of one delivery key: one round trip, no check-then-write.
-- KEYS[1] state hash, KEYS[2] lock (same hash tag, so one slot)
-- ARGV[1] owner token, ARGV[2] lease ms, ARGV[3] payload fingerprint,
-- ARGV[4] now (unix ms), ARGV[5] retention ms
-- Returns {'claimed'} | {'completed', status, headers, body} |
--         {'in_flight', remaining lease ms} | {'mismatch'} | {'queued'}
-- Delivery log, all optional: KEYS[3] the route's recent index (absent on
-- Redis Cluster, where it would be a second slot), ARGV[6] index cap, ARGV[7] the
-- delivery's key (index member), ARGV[8] '1' = an operator's replay (a forced
-- re-claim of a completed key), ARGV[9..12] the kept request: method, path, headers, body
--
-- Every redis.call from Lua costs about as much as the command itself (argument and
-- reply conversion), and this script runs for every delivery and every copy: one
-- HMGET reads all that any branch needs, one HSET writes all it changes
-- (BENCHMARKS.md, "What holds the figures").
--
-- An operator's replay of a completed key keeps the old answer in the hash and sets
-- `restore` = '1'. Until the replay records a new answer (complete.lua sets
-- `completed`), a key in `processing` with that mark and no live lock is completed with
-- its old answer: for the next copy here and for any release (release.lua), whether
-- the replayer failed, died, lost its reply or had its claim given up.
local forced = ARGV[8] == '1'
local s = redis.call('HMGET', KEYS[1], 'status', 'fp', 'attempts', 'first_seen',
  'duplicates', 'replays', 'resp_status', 'resp_headers', 'resp_body', 'restore')
local status = s[1]
-- A replay of a completed key whose claim lapsed without settling (see above).
local lapsed = status == 'processing' and s[10] == '1' and s[7]
  and redis.call('EXISTS', KEYS[2]) == 0
if lapsed then
  status = 'completed'
end
-- The recent index, scored by the last claim or copy. Trimmed when a member is added
-- (nothing else grows it). Its lifetime is renewed whenever a member is added and
-- whenever the claim gives the hash a new lifetime (`renews`), to retention + lease:
-- the completion, which leaves the index alone, renews the hash's retention when the
-- upstream call ends (by default within upstream_timeout, 10 s, well inside a 30 s
-- lease), so the index outlives the deliveries it lists. A copy renews neither.
local function log_recent(renews)
  if not KEYS[3] then
    return
  end
  local added = redis.call('ZADD', KEYS[3], ARGV[4], ARGV[7]) == 1
  if added then
    redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -tonumber(ARGV[6]) - 1)
  end
  if added or renews then
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[5]) + tonumber(ARGV[2]))
  end
end
local function copy_seen()
  local f = {'duplicates', (tonumber(s[5]) or 0) + 1, 'last_seen', ARGV[4]}
  if lapsed then
    f[5] = 'status'
    f[6] = 'completed'
  end
  redis.call('HSET', KEYS[1], unpack(f))
  log_recent(false)
end
-- A completed key without a fingerprint (its hash was lost during the upstream call
-- and re-created by the completion) answers every copy: never forwarded twice.
if status == 'completed' and not forced then
  if s[2] and s[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  copy_seen()
  return {'completed', s[7], s[8], s[9]}
end
-- An async route's delivery in its queue (or in delivery): copies get the ack again,
-- and so does an operator's replay (the queue's worker delivers it).
if status == 'queued' then
  if s[2] and s[2] ~= ARGV[3] then
    return {'mismatch'}
  end
  copy_seen()
  return {'queued'}
end
-- An operator's replay re-claims only the delivery it read: a key that is gone, or
-- now holds another payload, is a mismatch.
if forced and s[2] ~= ARGV[3] then
  return {'mismatch'}
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = {'status', 'processing', 'fp', ARGV[3], 'last_seen', ARGV[4],
    'first_seen', s[4] or ARGV[4], 'attempts', (tonumber(s[3]) or 0) + 1}
  if ARGV[9] then
    for _, v in ipairs({'req_method', ARGV[9], 'req_path', ARGV[10],
        'req_headers', ARGV[11], 'req_body', ARGV[12]}) do
      f[#f + 1] = v
    end
  end
  if forced then
    for _, v in ipairs({'replays', (tonumber(s[6]) or 0) + 1,
        'restore', status == 'completed' and '1' or '0'}) do
      f[#f + 1] = v
    end
  end
  redis.call('HSET', KEYS[1], unpack(f))
  -- The hash outlives the lock (renew.lua keeps it so): a completion or release
  -- never finds it gone.
  redis.call('PEXPIRE', KEYS[1], math.max(tonumber(ARGV[5]), tonumber(ARGV[2])))
  log_recent(true)
  return {'claimed'}
end
-- A retried claim (the first attempt ran but its reply was lost: a dropped connection,
-- a cluster client resending after a failover) finds its own token: it owns the key.
if redis.call('GET', KEYS[2]) == ARGV[1] then
  return {'claimed'}
end
if s[2] and s[2] ~= ARGV[3] then
  return {'mismatch'}
end
return {'in_flight', redis.call('PTTL', KEYS[2])}
