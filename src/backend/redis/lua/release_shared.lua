-- Removes a shared holder, or its tombstone after a `break` (an empty token: all of them, for
-- `break --force`), and wakes one waiter: for
-- a semaphore at every release (a slot is free), for a shared lock when the last one leaves.
-- KEYS: holders, hmeta, signal   ARGV: token, wake-up ttl ms, n (0: shared)
-- Reply: 1 removed, 0 not there.
local removed
if ARGV[1] == '' then
  removed = redis.call('DEL', KEYS[1])
  redis.call('DEL', KEYS[2])
else
  local broken = 'broken:' .. ARGV[1]
  removed = redis.call('ZREM', KEYS[1], ARGV[1]) + redis.call('ZREM', KEYS[1], broken)
  redis.call('HDEL', KEYS[2], ARGV[1], 'f:' .. ARGV[1], broken, 'f:' .. broken)
end
local left = redis.call('ZCARD', KEYS[1])
if left == 0 then redis.call('DEL', KEYS[2]) end
if removed > 0 and (ARGV[3] ~= '0' or left == 0) then
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], 1)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
end
return removed
