-- floorguard: fleet-wide slot leases for one backend (docs/design.md §13), atomically.
--
-- KEYS[1]  the backend's leases: a sorted set, member = "<replica>|<request>", score = the
--          instant (Redis clock) the lease expires unless renewed
-- KEYS[2]  the backend's waiting board: a hash, field = replica, value =
--          "<count>|<expiry>|<seq>": how many floor-entitled requests that replica has
--          waiting for a slot here, as of its call numbered seq
--          (both keys share one hash tag: one Redis Cluster slot)
-- ARGV     1 op: "acquire", "release", "renew" or "restore"
--          2 capacity C (acquire), 3 ttl_s, 4 replica, 5 waiting (this replica's entitled
--          requests queued, not counting the one acquiring),
--          6 entitled (0/1, acquire), 7 now: "" to read the Redis server's clock (TIME),
--          or the caller's time (s), 8 seq: the call's number (rising with each call the
--          replica sends), 9.. members (acquire: one; the others: any)
-- returns  {granted (0/1), reason ("" | "full" | "order"), leases in use, now (a string)}
--
-- acquire grants a member that already holds a live lease again (a retry of a call that
-- timed out after it ran gets the first grant: one lease, not two), and otherwise grants
-- iff fewer than C leases are live and, for a request that is not
-- floor-entitled, no *other* replica has an entitled request waiting for this backend
-- (fleet-wide assured-first). A denied entitled request counts itself as waiting, in the
-- same call, so the others stop starting opportunistic requests here at once. Leases not
-- renewed within ttl_s expire: a dead replica's slots come back within ttl_s of its last
-- renewal. restore puts leases back whatever the count (a replica that held them while
-- Redis was unreachable: they run, whether granted locally or expired meanwhile).
-- A replica's calls may reach Redis out of the order it sent them (one connection each):
-- a call numbered below the board entry's leaves the entry alone (it carries an older
-- count), so a late call cannot clear an entitled request that a newer one announced.

local op = ARGV[1]
local capacity = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local replica = ARGV[4]
local waiting = tonumber(ARGV[5])
local entitled = ARGV[6] == '1'
local seq = tonumber(ARGV[8])

local now = tonumber(ARGV[7])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

local granted, reason = 0, ''
if op == 'acquire' and redis.call('ZSCORE', KEYS[1], ARGV[9]) then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[9])
  granted = 1
elseif op == 'acquire' then
  if not entitled then
    local board = redis.call('HGETALL', KEYS[2])
    for i = 1, #board, 2 do
      if board[i] ~= replica then
        local count, expiry = string.match(board[i + 1], '^([^|]*)|([^|]*)')
        count, expiry = tonumber(count), tonumber(expiry)
        if expiry <= now then
          redis.call('HDEL', KEYS[2], board[i])
        elseif count > 0 then
          reason = 'order'
        end
      end
    end
  end
  if reason == '' then
    if redis.call('ZCARD', KEYS[1]) < capacity then
      redis.call('ZADD', KEYS[1], now + ttl, ARGV[9])
      granted = 1
    else
      reason = 'full'
    end
  end
  if granted == 0 and entitled then
    waiting = waiting + 1
  end
elseif op == 'release' then
  for i = 9, #ARGV do
    redis.call('ZREM', KEYS[1], ARGV[i])
  end
elseif op == 'renew' then
  for i = 9, #ARGV do
    redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[i])
  end
elseif op == 'restore' then
  for i = 9, #ARGV do
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  end
end

local stale = false
local mine = redis.call('HGET', KEYS[2], replica)
if mine then
  local expiry, last = string.match(mine, '^[^|]*|([^|]*)|(.*)$')
  stale = last ~= nil and tonumber(expiry) > now and tonumber(last) > seq
end
if stale then
  -- a newer call's count stands
elseif waiting > 0 then
  redis.call('HSET', KEYS[2], replica, waiting .. '|' .. (now + ttl) .. '|' .. ARGV[8])
else
  redis.call('HDEL', KEYS[2], replica)
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000) + 1000)
redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
return {granted, reason, redis.call('ZCARD', KEYS[1]), tostring(now)}
