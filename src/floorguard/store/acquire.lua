-- floorguard: take `weight` of `capacity` floor credits in the current window, atomically.
--
-- KEYS[1]  the tenant's counter: a hash {w = window index, used = credits taken in it}
-- ARGV     weight, capacity, window_s, origin_at, mode, now
--          mode "take":  add weight if used + weight <= capacity
--               "force": add weight regardless (a replica hands back what it granted
--                        locally while Redis was unreachable)
--               "peek":  change nothing
--          now: "" to read the Redis server's clock (TIME), or the caller's time in seconds
-- returns  {granted (0/1), window index, capacity - used}
--
-- The window index comes from the Redis server's clock (TIME) and the contract's origin
-- t0, so replicas whose clocks disagree still share one window. The key expires one second
-- after its window ends (on the clock in use).

local weight = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local window_s = tonumber(ARGV[3])
local origin = tonumber(ARGV[4])
local mode = ARGV[5]

local now = tonumber(ARGV[6])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local index = math.floor((now - origin) / window_s)

local stored = redis.call('HMGET', KEYS[1], 'w', 'used')
local used = 0
if stored[1] and tonumber(stored[1]) == index then
  used = tonumber(stored[2])
end

local granted = 0
if mode == 'force' or (mode == 'take' and used + weight <= capacity) then
  used = used + weight
  granted = 1
end
if mode ~= 'peek' then
  redis.call('HSET', KEYS[1], 'w', index, 'used', used)
  local left_ms = math.ceil((origin + (index + 1) * window_s - now) * 1000)
  redis.call('PEXPIRE', KEYS[1], left_ms + 1000)
end
return {granted, index, capacity - used}
