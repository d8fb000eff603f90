-- Extends a shared holder's or semaphore slot's lease if it is still live.
-- KEYS: holders, hmeta, lock   ARGV: token, ttl ms   Reply: 1, 0 (lost), -2 (a `break` told it
-- to stop: break.lua), or -1: the exclusive
-- lock key is set while this holder is live, which dlock never does (an exclusive run waits for
-- the holders to leave): a client that is not dlock (redis-py's Lock) took it without seeing
-- the holders, and holds too.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local s = redis.call('ZSCORE', KEYS[1], ARGV[1])
if s and tonumber(s) > now then
  if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  if redis.call('PTTL', KEYS[1]) < ttl then
    redis.call('PEXPIRE', KEYS[1], ttl)
    redis.call('PEXPIRE', KEYS[2], ttl)
  end
  return 1
end
if redis.call('ZSCORE', KEYS[1], 'broken:' .. ARGV[1]) then return -2 end
return 0
