-- The newest start of the key's history and how long ago it was, by the server's clock; for a
-- Redlock `--once-per`, which asks every master before it writes to any.
-- KEYS: lastrun   Reply: {} no start; {the newest start ("MS BODY"), ms since it}.
local last = redis.call('GET', KEYS[1])
local at = last and tonumber(string.match(last, '^(%d+) '))
if not at then return {} end
local t = redis.call('TIME')
local ago = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - at
if ago < 0 then ago = 0 end
return {last, ago}
