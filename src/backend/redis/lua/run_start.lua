-- Adds a run's start event to the key's history, by the server's clock — unless ARGV[2] > 0 and
-- the newest start is younger than ARGV[2] ms (`--once-per`): then adds nothing. A start dated
-- more than ARGV[2] ms in the future (a clock that went back, a failover to a server whose
-- clock is behind) does not count: it would skip every run until the clock caught up; one
-- less far ahead counts as just now.
-- KEYS: runs (a list, newest first), lastrun (the newest start, "MS BODY")
-- ARGV: body, once-per ms (0: none), events kept, ms the history outlives its last write,
--       bytes of the newest start returned
-- Reply: {1, the entry added} added; {0, the newest start (cut to ARGV[5] bytes), ms since it}
-- skipped.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local within = tonumber(ARGV[2])
if within > 0 then
  local last = redis.pcall('GET', KEYS[2])
  local at = type(last) == 'string' and tonumber(string.match(last, '^(%d+) '))
  if at then
    local ago = now - at
    if ago < 0 and -ago <= within then ago = 0 end
    if ago >= 0 and ago < within then return {0, string.sub(last, 1, tonumber(ARGV[5])), ago} end
  end
end
local entry = string.format('%d %s', now, ARGV[1])
redis.call('LPUSH', KEYS[1], entry)
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], entry, 'PX', ARGV[4])
return {1, entry}
