-- Prepended to acquire.lua and acquire_shared.lua: the reply for a granted lock,
-- {1, fence, uptime} with the server's uptime in seconds (the client decides whether a young
-- server must hold the lock back), or {1, fence} when the user's ACL does not allow INFO.
-- INFO runs after the writes, so such a user still gets the lock.
local function granted(fence)
  local info = redis.pcall('INFO', 'server')
  if type(info) == 'string' then
    local up = tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
    if up then return {1, fence, up} end
  end
  return {1, fence}
end
