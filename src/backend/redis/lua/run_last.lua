-- The newest start of the key's history and how long ago it was, by the server's clock; for a
-- Redlock `--once-per`, which asks every master before it writes to any. A start dated more
-- than ARGV[1] ms in the future does not count (see run_start.lua).
-- KEYS: lastrun   ARGV: once-per ms, bytes of the start returned
-- Reply: {} no start that counts; {the newest start ("MS BODY", cut), ms since it}.
local last = redis.pcall('GET', KEYS[1])
local at = type(last) == 'string' and tonumber(string.match(last, '^(%d+) '))
if not at then return {} end
local t = redis.call('TIME')
local ago = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - at
if ago < 0 then
  if -ago > tonumber(ARGV[1]) then return {} end
  ago = 0
end
return {string.sub(last, 1, tonumber(ARGV[2])), ago}
