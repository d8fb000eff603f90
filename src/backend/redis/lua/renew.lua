-- Extends the lock and its metadata if the token is still ours.
-- KEYS: lock, owner   ARGV: token, ttl ms   Reply: 1, 0 (lost), or -2 (a `break` told it to
-- stop: break.lua).
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
if holder == 'broken:' .. ARGV[1] then return -2 end
return 0
