-- Adds a run's start event to the key's history, by the server's clock — unless ARGV[2] > 0 and
-- the newest start is younger than ARGV[2] ms (`--once-per`): then adds nothing.
-- KEYS: runs (a list, newest first), lastrun (the newest start, "MS BODY")
-- ARGV: body, once-per ms (0: none), events kept, ms the history outlives its last write
-- Reply: {1} added; {0, the newest start, ms since it} skipped.
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local within = tonumber(ARGV[2])
if within > 0 then
  local last = redis.call('GET', KEYS[2])
  local at = last and tonumber(string.match(last, '^(%d+) '))
  if at then
    local ago = now - at
    if ago < 0 then ago = 0 end
    if ago < within then return {0, last, ago} end
  end
end
local entry = string.format('%d %s', now, ARGV[1])
redis.call('LPUSH', KEYS[1], entry)
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[3]) - 1)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SET', KEYS[2], entry, 'PX', ARGV[4])
return {1}
