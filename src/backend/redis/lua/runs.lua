-- The newest events of the key's history, each cut to ARGV[2] bytes, so that a forged history
-- cannot make the reply large.
-- KEYS: runs   ARGV: how many, bytes per event   Reply: the events, newest first.
local all = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
local cap = tonumber(ARGV[2])
for i, e in ipairs(all) do
  if #e > cap then all[i] = string.sub(e, 1, cap) end
end
return all
