-- Creates a job in one step: its staged work list becomes the job's and its record is
-- written; until then no sidecar takes or runs it. When the job exists (a retried
-- start), changes nothing (the staged list is dropped) and returns its record.
-- KEYS[1] the job's hash, KEYS[2] its work list, KEYS[3] the staged work list (absent
-- for a job without items); ARGV[1] how long the job's keys live (ms), ARGV[2..] the
-- record's fields and values. Returns 1 when created, else the job's HGETALL.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[3])
  return redis.call('HGETALL', KEYS[1])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('RENAME', KEYS[3], KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[1])
else
  redis.call('DEL', KEYS[2])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
