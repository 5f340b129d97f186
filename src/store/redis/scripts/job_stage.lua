-- Appends items to a job's staged work list, which expires unless the job's creation
-- (job_create.lua) makes it the job's: a start that fails midway leaves nothing that
-- lives on. KEYS[1] the staged list; ARGV[1] its lifetime (ms), ARGV[2..] the items.
redis.call('RPUSH', KEYS[1], unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
