-- Takes an item's mark before a job acts on it: {1} when nobody did before, else
-- {0, what the earlier mark says ('started', 'ok' or 'failed:<why>')}.
-- KEYS[1] the job's item marks; ARGV[1] item
if redis.call('HSETNX', KEYS[1], ARGV[1], 'started') == 1 then
  return {1}
end
return {0, redis.call('HGET', KEYS[1], ARGV[1])}
