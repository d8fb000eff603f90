-- Everything `status` shows, read atomically with the server's clock: token, PTTL, metadata,
-- fencing token, the owner's token, live waiters.
-- KEYS: lock, owner, waiters
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return {redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1]),
        redis.call('HGET', KEYS[2], 'meta') or '', redis.call('HGET', KEYS[2], 'fence') or '',
        redis.call('HGET', KEYS[2], 'token') or '', redis.call('ZCOUNT', KEYS[3], now, '+inf')}
