-- Takes an item's mark before a job acts on it: {1} when nobody did before, else
-- {0, what the earlier mark says ('started', 'ok' or 'failed:<why>')}, or {2} when
-- ARGV[1] no longer runs the job (taken over: it must stop, not act).
-- KEYS[1] the job's hash, KEYS[2] its item marks; ARGV[1] owner, ARGV[2] item,
-- ARGV[3] how long the job's keys live (ms): the marks live as long as the job even
-- when its runner dies before its first heartbeat.
local m = redis.call('HMGET', KEYS[1], 'owner', 'state')
if m[1] ~= ARGV[1] or m[2] ~= 'running' then
  return {2}
end
if redis.call('HSETNX', KEYS[2], ARGV[2], 'started') == 1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return {1}
end
return {0, redis.call('HGET', KEYS[2], ARGV[2])}
