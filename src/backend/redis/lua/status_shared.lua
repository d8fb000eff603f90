-- The shared holders, for `status`: the mode (hmeta's ~mode), then for each live holder its
-- token, lease left (ms), metadata and fencing token.
-- KEYS: holders, hmeta
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {redis.call('HGET', KEYS[2], '~mode') or ''}
local all = redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf', 'WITHSCORES')
for i = 1, #all, 2 do
  local tok = all[i]
  table.insert(out, tok)
  table.insert(out, tostring(tonumber(all[i + 1]) - now))
  table.insert(out, redis.call('HGET', KEYS[2], tok) or '')
  table.insert(out, redis.call('HGET', KEYS[2], 'f:' .. tok) or '')
end
return out
