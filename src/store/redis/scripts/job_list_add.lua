-- Lists a job before it is created: the listing skips an ID without a record. Drops
-- jobs created more than a job's lifetime before this one (their keys are gone by
-- then, or soon), so the index does not grow with every job ever run. NX: a retried
-- start keeps its job's place. KEYS[1] the jobs' index; ARGV[1] the job's creation
-- (Unix ms), ARGV[2] its ID, ARGV[3] the oldest creation kept, ARGV[4] the index's
-- lifetime (ms).
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
redis.call('ZADD', KEYS[1], 'NX', ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
