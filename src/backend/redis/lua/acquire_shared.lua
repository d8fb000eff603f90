-- Shared lock (ARGV[5] = 0) or semaphore slot (ARGV[5] = n).
-- KEYS: lock, fence, hmeta, waiters, holders, wwait, signal, owner
-- ARGV: token, ttl ms, holder metadata, wait slice ms, n, wake-up ttl ms, ms the fence counter
-- outlives its last use (the retention)
-- Purges expired holders, then enters `holders` (token -> lease end on the server's clock)
-- when no exclusive holder holds and, for a shared lock, no exclusive run waits (writer
-- preference), or for a semaphore when fewer than n hold. A shared holder that enters passes
-- the wake-up on (the next waiter may be a reader too). Replies as acquire.lua; {-1, m} when
-- the holders use another mode (m = 0 shared, -1 exclusive, else their n). The lock key held
-- without dlock's owner record (an application's lock on the same key) is a holder to wait for,
-- never another mode.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local n = tonumber(ARGV[5])
for _, g in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)) do
  redis.call('HDEL', KEYS[3], g, 'f:' .. g)
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
local count = redis.call('ZCARD', KEYS[5])
if count == 0 then redis.call('DEL', KEYS[3]) end
if redis.call('ZSCORE', KEYS[5], ARGV[1]) then
  return granted(tonumber(redis.call('HGET', KEYS[3], 'f:' .. ARGV[1])))
end
local mode = redis.call('HGET', KEYS[3], '~mode')
if mode and tonumber(mode) ~= n then return {-1, tonumber(mode)} end
local busy
if redis.call('EXISTS', KEYS[1]) == 1 then
  if n > 0 and redis.call('HGET', KEYS[8], 'token') == redis.call('GET', KEYS[1]) then
    return {-1, -1}
  end
  busy = true
elseif n > 0 then
  busy = count >= n
else
  busy = redis.call('ZCOUNT', KEYS[6], now, '+inf') > 0
end
if not busy then
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now * 1000)
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[7])
  redis.call('ZADD', KEYS[5], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[3], '~mode', n, ARGV[1], ARGV[3], 'f:' .. ARGV[1], fence)
  if redis.call('PTTL', KEYS[5]) < ttl then redis.call('PEXPIRE', KEYS[5], ttl) end
  redis.call('PEXPIRE', KEYS[3], redis.call('PTTL', KEYS[5]))
  redis.call('ZREM', KEYS[4], ARGV[1])
  if n == 0 and redis.call('ZCOUNT', KEYS[4], now, '+inf') > 0 then
    redis.call('DEL', KEYS[7])
    redis.call('RPUSH', KEYS[7], 1)
    redis.call('PEXPIRE', KEYS[7], ARGV[6])
  end
  return granted(fence)
end
local slice = tonumber(ARGV[4])
if slice > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  redis.call('ZADD', KEYS[4], now + slice + 1000, ARGV[1])
  if redis.call('PTTL', KEYS[4]) < slice + 1000 then
    redis.call('PEXPIRE', KEYS[4], slice + 1000)
  end
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then
  local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if first[2] then pttl = tonumber(first[2]) - now else pttl = -1 end
end
return {0, pttl}
