-- Exclusive acquire.
-- KEYS: lock, fence, owner, waiters, holders, wwait, hmeta
-- ARGV: token, ttl ms, holder metadata (JSON), wait slice ms (0: not waiting), ms the fence
-- counter outlives its last use (the retention: it starts again from the clock after)
-- SET NX PX; on success the fence becomes max(fence + 1, server clock in µs), so a server that
-- lost the counter (flushed, restarted without persistence) or came back with an older one (an
-- RDB snapshot) still hands out larger tokens; the owner hash gets the metadata. "Already mine"
-- is success too (a retry after a lost reply). Live shared holders keep it out. On failure a
-- waiting caller registers as a waiter and as a waiting writer (which keeps new shared holders
-- out). `started` (no_start.lua or start.lua, prepended) records the run's start with a lock
-- SET NX took. Replies: granted (see granted.lua); {0, ms} busy, look again within ms without a
-- wake-up; {-1, n} the key is held as a semaphore of n.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local slice = tonumber(ARGV[4])
local function wait()
  if slice > 0 then
    for _, k in ipairs({KEYS[4], KEYS[6]}) do
      redis.call('ZREMRANGEBYSCORE', k, '-inf', now)
      redis.call('ZADD', k, now + slice + 1000, ARGV[1])
      if redis.call('PTTL', k) < slice + 1000 then
        redis.call('PEXPIRE', k, slice + 1000)
      end
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
if redis.call('ZCARD', KEYS[5]) > 0 then
  local mode = tonumber(redis.call('HGET', KEYS[7], '~mode') or '0')
  if mode > 0 then return {-1, mode} end
  wait()
  local first = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  return {0, tonumber(first[2]) - now}
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = math.max(tonumber(redis.call('GET', KEYS[2]) or '0') + 1, now * 1000)
  redis.call('SET', KEYS[2], string.format('%d', fence), 'PX', ARGV[5])
  redis.call('HSET', KEYS[3], 'token', ARGV[1], 'fence', fence, 'meta', ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[6], ARGV[1])
  return granted(fence, started(fence, now))
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('ZREM', KEYS[6], ARGV[1])
  return granted(tonumber(redis.call('HGET', KEYS[3], 'fence')))
end
wait()
return {0, redis.call('PTTL', KEYS[1])}
