-- Takes back a start that run_start.lua or start.lua added (a Redlock start that fewer masters
-- than a quorum recorded, a grant given back: it must not make later runs skip, nor show as a
-- run that never ended). lastrun, when it is that start, goes back to the newest start still in
-- the list — the one it replaced — for the rest of its time: deleting it made `--once-per`
-- forget a run that did happen, and run again within its window.
-- KEYS: runs, lastrun   ARGV: the entry run_start.lua returned   Reply: 1.
redis.pcall('LREM', KEYS[1], 1, ARGV[1])
if redis.pcall('GET', KEYS[2]) == ARGV[1] then
  local ttl = redis.pcall('PTTL', KEYS[2])
  local items = redis.pcall('LRANGE', KEYS[1], 0, 199)
  local before = false
  if type(items) == 'table' then
    for _, e in ipairs(items) do
      -- A body is compact JSON: inside a string a quote is escaped, so this is the field.
      if type(e) == 'string' and string.find(e, '"ev":"start"', 1, true) then
        before = e
        break
      end
    end
  end
  if before and type(ttl) == 'number' and ttl > 0 then
    redis.pcall('SET', KEYS[2], before, 'PX', ttl)
  else
    redis.pcall('DEL', KEYS[2])
  end
end
return 1
