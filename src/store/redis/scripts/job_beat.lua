-- A job runner's heartbeat, and its state change when ARGV[3] is not ''. Owner only:
-- a runner that lost the job (taken over as stale) learns it here.
-- KEYS[1] the job's hash, KEYS[2] its work list, KEYS[3] its item marks;
-- ARGV[1] owner, ARGV[3] new state or '', ARGV[4] error,
-- ARGV[5] how long the job's keys live (ms). The beat is this server's time (TIME).
-- Returns 1, or 0 when not the owner.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'state') ~= 'running' then
  return 0
end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'beat', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'state', ARGV[3], 'error', ARGV[4])
end
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], ARGV[5])
end
return 1
