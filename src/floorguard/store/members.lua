-- floorguard: the live fleet (docs/design.md §14), atomically: which replicas share this store.
--
-- KEYS[1]  the members: a sorted set, member = replica, score = the instant (Redis clock)
--          its entry expires unless it beats again
-- KEYS[2]  what each member applies: a hash, field = replica, value = "<count>|<settled>":
--          the replica count its shares follow, and 1 once its requests in flight fit them
-- KEYS[3]  the members that left (after their drain): a sorted set, score = when the
--          record of their leaving expires (ttl_s after it)
--          (the keys share one hash tag: one Redis Cluster slot)
-- ARGV     1 op: "beat" or "leave", 2 replica, 3 ttl_s, 4 count, 5 settled (0/1)
-- returns  {now (a string), {replica, "<count>|<settled>|<expires at>", replica, …},
--          {replica that left, …}, 1 if the caller was a live member before this call
--          else 0}: every live member after this call, and those that left within the
--          last ttl_s
--
-- A beat (re)announces the caller until now + ttl_s; entries not renewed by then are
-- gone, with what they applied. A replica that leaves (after its drain) is gone at once,
-- and says so: a member missing without having left is one the store forgot (a restart, a
-- flush, an eviction) unless its time ran out, which the callers tell apart.

local op, replica, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, member in ipairs(expired) do
  redis.call('HDEL', KEYS[2], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local was_member = redis.call('ZSCORE', KEYS[1], replica) and 1 or 0

if op == 'beat' then
  redis.call('ZADD', KEYS[1], now + ttl, replica)
  redis.call('HSET', KEYS[2], replica, ARGV[4] .. '|' .. ARGV[5])
  redis.call('ZREM', KEYS[3], replica)
else
  redis.call('ZREM', KEYS[1], replica)
  redis.call('HDEL', KEYS[2], replica)
  redis.call('ZADD', KEYS[3], now + ttl, replica)
end
for i = 1, 3 do
  redis.call('PEXPIRE', KEYS[i], math.ceil(ttl * 1000) + 1000)
end

local live = {}
for _, entry in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')) do
  live[#live + 1] = entry
end
local members = {}
for i = 1, #live, 2 do
  members[#members + 1] = live[i]
  members[#members + 1] = (redis.call('HGET', KEYS[2], live[i]) or '0|0') .. '|' .. live[i + 1]
end
return {tostring(now), members, redis.call('ZRANGE', KEYS[3], 0, -1), was_member}
