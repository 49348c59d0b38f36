-- floorguard: the live fleet (SPEC §14), atomically: which replicas share this store.
--
-- KEYS[1]  the members: a sorted set, member = replica, score = the instant (Redis clock)
--          its entry expires unless it beats again
-- KEYS[2]  what each member applies: a hash, field = replica, value = "<count>|<settled>":
--          the replica count its shares follow, and 1 once its requests in flight fit them
--          (both keys share one hash tag: one Redis Cluster slot)
-- ARGV     1 op: "beat" or "leave", 2 replica, 3 ttl_s, 4 count, 5 settled (0/1)
-- returns  {now (a string), replica, "<count>|<settled>", replica, …}: every live member,
--          after this call
--
-- A beat (re)announces the caller until now + ttl_s; entries not renewed by then are
-- gone, with what they applied. A replica that leaves (after its drain) is gone at once.

local op, replica, ttl = ARGV[1], ARGV[2], tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000

local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, member in ipairs(expired) do
  redis.call('HDEL', KEYS[2], member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

if op == 'beat' then
  redis.call('ZADD', KEYS[1], now + ttl, replica)
  redis.call('HSET', KEYS[2], replica, ARGV[4] .. '|' .. ARGV[5])
else
  redis.call('ZREM', KEYS[1], replica)
  redis.call('HDEL', KEYS[2], replica)
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000) + 1000)
redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)

local reply = {tostring(now)}
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  reply[#reply + 1] = member
  reply[#reply + 1] = redis.call('HGET', KEYS[2], member) or '0|0'
end
return reply
