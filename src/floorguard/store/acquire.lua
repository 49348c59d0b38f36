-- floorguard: take `weight` of `capacity` floor credits in the current window, atomically,
-- after adding what the calling replica carries back.
--
-- KEYS[1]  the tenant's counter: a hash {w = window index, used = credits taken in it}
-- KEYS[2]  the tenant's generation marker: a token written when the counter's state began,
--          with the Redis server that last wrote it (generation.lua)
--          (both keys share one hash tag, so a Redis Cluster keeps them in one slot)
-- ARGV     1 weight, 2 capacity, 3 window_s, 4 origin_at,
--          5 mode: "take" (add weight if used + weight <= capacity) or "peek" (change
--            nothing but the carry),
--          6 now: "" to read the Redis server's clock (TIME), or the caller's time (s),
--          7 the generation the caller last saw for this tenant ("" = none),
--          8 a fresh token, written as the generation if the marker is missing,
--          9 carry window: the window index the two carries below belong to,
--          10 carry shared: what the caller granted through Redis in that window; added
--             back only when the generation changed (Redis lost its state: the counter
--             restarted from nothing, so the caller's earlier grants are re-forced),
--          11 carry local: what the caller granted locally while Redis was unreachable, in
--             that window; always added, before the take (hand-back before take),
--          12 the caller's id: a re-force is applied once per caller and window (a field
--             `r:<id>` of the counter), however many of its calls carried the old generation
--          13 the caller's floor: the contract's B (capacity is less while its floor is
--             lowered)
--          14 the call's id ("" = none): a take carrying an id is applied once; the same
--             id again (a retry after a timeout that Redis had already run) gets the first
--             answer, nothing charged or carried twice
--          15 a retry of that id: the window its first attempt was sent in, as the caller
--             reckoned it ("" = not a retry)
--          16 the carried local grants one by one, `id=weight` separated by spaces ("" =
--             none: carry local counts as it is): a grant counted once in the window (a
--             field `h:<id>`) is not counted again, so a hand-back resent after a call that
--             timed out once Redis had run it is counted once
-- returns  {granted (0/1), window index, what is left, generation, the clock used (a
--          string, seconds), credits re-forced for a lost state, closed (0/1), the
--          window's floor, replayed (0/1: the id's first answer), unsure (0/1)}
--
-- The counter holds one window: a call in a later window starts it afresh (every field of
-- the hash — the ids applied, the marks, `lost` — belongs to its window).
--
-- A retry whose id is not in the window, when the caller's first attempt was in an earlier
-- window (ARGV 15) that is gone, cannot know whether that attempt was charged: it is
-- granted without a charge (`unsure`), the side that keeps the tenant's floor, in that
-- earlier window (the one the request arrived in and was, or was not, charged in).
--
-- The first take in a window *pins* its floor (field `floor`): every later call in that
-- window is judged against it, whatever floor its caller has, so replicas that a reload
-- reaches at different times still agree on one floor per tenant and window. A caller
-- whose floor is lowered takes at most min(its capacity, the pinned floor); what is left
-- is counted against that limit.
--
-- A lost state (a caller that saw another generation, or a marker another Redis server
-- wrote: a failover, a restart; generation.lua) *closes* the tenant's current window to
-- fresh takes: a replica cannot know what the others granted there before the loss until
-- they re-force it, so no one takes more in that window (as fail-static grants nothing in
-- the window Redis was lost in); re-forces and hand-backs still count. A marker another
-- server wrote closes it at the first call that meets it, whoever sends it: a replica that
-- started after a failover has seen no generation, and the count it would take against
-- may miss what the old master granted.
--
-- The window index comes from the clock in use and the contract's origin t0, so replicas
-- whose clocks disagree still share one window. The counter expires one second after its
-- window ends. The marker never expires: a marker gone by its ttl would read, to every
-- replica that saw it, as a Redis that lost the tenant's state, and close a window no one
-- lost (a tenant idle for longer than the ttl would be refused inside its floor); without
-- a ttl, no `volatile-*` eviction policy can pick it either.

local weight = tonumber(ARGV[1])
local capacity = tonumber(ARGV[2])
local own_floor = tonumber(ARGV[13])
local window_s = tonumber(ARGV[3])
local origin = tonumber(ARGV[4])
local mode = ARGV[5]

local now = tonumber(ARGV[6])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local index = math.floor((now - origin) / window_s)

local generation, moved = generation_of(KEYS[2], ARGV[8])
redis.call('PERSIST', KEYS[2])  -- a marker written by a release that gave it a ttl

local stored = redis.call('HMGET', KEYS[1], 'w', 'used', 'floor')
local used, floor = 0, nil
if stored[1] and tonumber(stored[1]) == index then
  used = tonumber(stored[2])
  floor = tonumber(stored[3])
elseif stored[1] then
  redis.call('DEL', KEYS[1])  -- another window's: none of it holds now
end
local pinned = floor ~= nil
floor = floor or own_floor
local limit = floor
if capacity < own_floor then
  limit = math.min(capacity, floor)
end

local op = ARGV[14]
if mode == 'take' and op ~= '' then
  local first = redis.call('HGET', KEYS[1], 'op:' .. op)
  local closed_now = tonumber(redis.call('HGET', KEYS[1], 'lost')) == index
  if first then
    return {tonumber(first), index, limit - used, generation, tostring(now), 0,
            closed_now and 1 or 0, floor, 1, 0}
  end
  local first_window = tonumber(ARGV[15])
  if first_window ~= nil and first_window < index then
    return {1, first_window, 0, generation, tostring(now), 0, closed_now and 1 or 0,
            floor, 0, 1}
  end
end

local carried = tonumber(ARGV[9]) == index
local restored = 0
if moved or (generation ~= ARGV[7] and ARGV[7] ~= '') then
  redis.call('HSET', KEYS[1], 'lost', index)
  local mark = 'r:' .. ARGV[12]
  if carried and tonumber(redis.call('HGET', KEYS[1], mark)) ~= index then
    restored = tonumber(ARGV[10])
    redis.call('HSET', KEYS[1], mark, index)
  end
end
local closed = tonumber(redis.call('HGET', KEYS[1], 'lost')) == index
local handed = 0
local fresh = {}
if carried and ARGV[16] ~= '' then
  for grant, grant_weight in string.gmatch(ARGV[16], '(%S+)=(%d+)') do
    if not redis.call('HGET', KEYS[1], 'h:' .. grant) then
      handed = handed + tonumber(grant_weight)
      fresh[#fresh + 1] = grant
    end
  end
elseif carried then
  handed = tonumber(ARGV[11])
end
used = used + restored + handed

local granted = 0
if mode == 'take' and not closed and used + weight <= limit then
  used = used + weight
  granted = 1
end
if mode == 'take' or restored + handed > 0 or closed then
  redis.call('HSET', KEYS[1], 'w', index, 'used', used)
  for _, grant in ipairs(fresh) do
    redis.call('HSET', KEYS[1], 'h:' .. grant, 1)
  end
  if mode == 'take' then
    redis.call('HSET', KEYS[1], 'floor', floor)
    if op ~= '' then
      redis.call('HSET', KEYS[1], 'op:' .. op, granted)
    end
  elseif not pinned then
    redis.call('HDEL', KEYS[1], 'floor')
  end
  local left_ms = math.ceil((origin + (index + 1) * window_s - now) * 1000)
  redis.call('PEXPIRE', KEYS[1], left_ms + 1000)
end
return {granted, index, limit - used, generation, tostring(now), restored, closed and 1 or 0,
        floor, 0, 0}
