-- Prepended to acquire.lua for a run whose start is recorded with the lock (one exclusive key,
-- no --once-per): when SET NX takes the lock, the start event is added as run_start.lua adds
-- it, by the server's clock at that moment, with the fence spliced in as its token.
-- KEYS[8]: runs (a list, newest first), KEYS[9]: lastrun
-- ARGV[6]: the start event without its token (a JSON object: ends with '}'), ARGV[7]: events
-- kept, ARGV[8]: ms the history outlives its last write, ARGV[9]: '1' to splice the fence in
-- ('0' for a Redlock master: one master's fence is no token, and every master's copy of the
-- event must be the same)
-- Returns the entry added (the acquire's reply carries it: the client takes it back if the
-- grant is then given back).
local function started(fence, now)
  local body = ARGV[6]
  if ARGV[9] == '1' then
    body = string.sub(ARGV[6], 1, -2) .. string.format(',"token":%d}', fence)
  end
  local entry = string.format('%d %s', now, body)
  -- A history key of another type (someone else's) must not cost the lock: no start then (the
  -- client writes it as without this script, and warns when that fails).
  if type(redis.pcall('LPUSH', KEYS[8], entry)) ~= 'number' then return nil end
  redis.pcall('LTRIM', KEYS[8], 0, tonumber(ARGV[7]) - 1)
  redis.pcall('PEXPIRE', KEYS[8], ARGV[8])
  redis.pcall('SET', KEYS[9], entry, 'PX', ARGV[8])
  return entry
end
