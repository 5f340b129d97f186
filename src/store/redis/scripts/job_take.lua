-- Makes ARGV[1] a job's runner when the job is running with a heartbeat older than
-- ARGV[2] ms (its sidecar died), or, with ARGV[4] = '1', also when it failed. An
-- empty ARGV[1] hands the job to the deployment: its beat is left stale, so the first
-- sidecar that looks takes it.
-- KEYS[1] the job's hash, KEYS[2] its work list, KEYS[3] its item marks;
-- ARGV[5] how long the job's keys live (ms); the time is this server's (TIME), so
-- the sidecars' clocks never decide that a live job is stale. Returns 1 if taken.
local m = redis.call('HMGET', KEYS[1], 'state', 'beat')
if not m[1] then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = now - (tonumber(m[2] or '0') or 0) >= tonumber(ARGV[2])
if (m[1] == 'running' and stale) or (ARGV[4] == '1' and m[1] == 'failed') then
  local beat = now
  if ARGV[1] == '' then
    beat = 0
  end
  redis.call('HSET', KEYS[1], 'state', 'running', 'owner', ARGV[1], 'beat', beat, 'error', '')
  for i = 1, 3 do
    redis.call('PEXPIRE', KEYS[i], ARGV[5])
  end
  return 1
end
return 0
