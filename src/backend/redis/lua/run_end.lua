-- Adds a run's end event to the key's history, by the server's clock. The first part of
-- release_end (then release.lua runs, with its KEYS[1..3] and ARGV[1..2]) and of end_run.
-- Every write is a pcall: a history key of another type (or any error here) must never keep
-- the release that follows from running.
-- KEYS[4]: runs   ARGV[3]: body, ARGV[4]: events kept, ARGV[5]: ms the history outlives it
if redis.replicate_commands then redis.replicate_commands() end
do
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.pcall('LPUSH', KEYS[4], string.format('%d %s', now, ARGV[3]))
  redis.pcall('LTRIM', KEYS[4], 0, tonumber(ARGV[4]) - 1)
  redis.pcall('PEXPIRE', KEYS[4], ARGV[5])
end
