-- Extends the lock and its metadata if the token is still ours.
-- KEYS: lock, owner   ARGV: token, ttl ms   Reply: 1, or 0 (lost).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
