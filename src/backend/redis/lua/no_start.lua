-- Prepended to acquire.lua when the run's start is not recorded with the lock (see start.lua).
local function started(fence, now)
  return nil
end
