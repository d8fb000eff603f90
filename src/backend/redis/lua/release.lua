-- Deletes the lock if the token is ours, or our tombstone after a `break` (an empty token, for
-- `break --force`: whoever holds it), and
-- pushes one wake-up that expires unless a waiter takes it.
-- KEYS: lock, owner, signal   ARGV: token, wake-up ttl ms   Reply: 1 released, 0 not ours.
local holder = redis.call('GET', KEYS[1])
if holder and (ARGV[1] == '' or holder == ARGV[1] or holder == 'broken:' .. ARGV[1]) then
  redis.call('DEL', KEYS[1], KEYS[2])
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return 1
end
return 0
