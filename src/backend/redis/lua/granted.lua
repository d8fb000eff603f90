-- Prepended to acquire.lua and acquire_shared.lua: the reply for a granted lock,
-- {1, fence, uptime, maxmemory_policy, role[, entry]} (entry: the run's start recorded with the
-- lock, start.lua), the middle three read from INFO after the writes (the client
-- decides whether a young server must hold the lock back, whether the policy can evict the
-- lock, whether this is a replica that took the write). Each is false (nil to the client) when
-- the user's ACL does not allow INFO: such a user still gets the lock. ~10 µs of server time.
local function info(section, pattern)
  local text = redis.pcall('INFO', section)
  if type(text) == 'string' then
    return string.match(text, pattern) or false
  end
  return false
end
local function granted(fence, entry)
  local up = info('server', 'uptime_in_seconds:(%d+)')
  return {1, fence, up and tonumber(up) or false,
    info('memory', 'maxmemory_policy:([%w-]+)'), info('replication', 'role:(%a+)'), entry}
end
