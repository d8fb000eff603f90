-- Takes back a start that run_start.lua added (a Redlock start that fewer masters than a
-- quorum recorded: it must not make later runs skip, nor show as a run that never ended).
-- KEYS: runs, lastrun   ARGV: the entry run_start.lua returned   Reply: 1.
redis.pcall('LREM', KEYS[1], 1, ARGV[1])
if redis.pcall('GET', KEYS[2]) == ARGV[1] then redis.pcall('DEL', KEYS[2]) end
return 1
