-- A safe `break`: every holder is told to stop, and nothing is freed. The lock key's value (the
-- holder's token) becomes 'broken:' .. token with the lease it had left, so the holder's next
-- renewal fails (renew.lua's -2): it stops its command, and then its release deletes the
-- tombstone. Waiters see the lock busy until then, or until the lease runs out, renewed by no
-- one (by when the holder has stopped its command, by the lifetime rules). Shared holders and
-- semaphore slots become 'broken:' .. token the same way, keeping their score (lease end).
-- KEYS: lock, owner, holders, hmeta   Reply: the longest lease left (ms), 0 when nothing held.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local left = 0
local tok = redis.call('GET', KEYS[1])
-- Only a dlock holder's key (dlock writes its owner hash in the same script): another client's
-- lock is left alone, and with no lease left reported as not dlock's.
if tok and redis.call('EXISTS', KEYS[2]) == 1 then
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl > 0 then
    if string.sub(tok, 1, 7) ~= 'broken:' then
      redis.call('SET', KEYS[1], 'broken:' .. tok, 'PX', pttl)
    end
    left = pttl
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local all = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #all, 2 do
  local m, score = all[i], tonumber(all[i + 1])
  if string.sub(m, 1, 7) ~= 'broken:' then
    redis.call('ZREM', KEYS[3], m)
    redis.call('ZADD', KEYS[3], score, 'broken:' .. m)
    for _, f in ipairs({'', 'f:'}) do
      local v = redis.call('HGET', KEYS[4], f .. m)
      if v then redis.call('HSET', KEYS[4], f .. 'broken:' .. m, v) end
      redis.call('HDEL', KEYS[4], f .. m)
    end
  end
  left = math.max(left, score - now)
end
return left
