-- floorguard: fleet-wide slot leases for one backend of a pool (docs/design.md §13),
-- atomically.
--
-- KEYS[1]  the backend's leases: a sorted set, member = "<replica>|<request>|<n>" (or
--          "<replica>|handed|<n>": a slot handed over), score = the instant (Redis clock)
--          the lease expires unless renewed
-- KEYS[2]  the pool's waiting board, one for all its backends (a request waits for a
--          slot on any of them): a hash with
--            field <replica> = "<entitled>|<expiry>|<seq>|<surplus>": how many
--              floor-entitled and how many other requests that replica has waiting for a
--              slot in the pool, as of its call numbered seq;
--            field "|turn": the hand-over's round-robin count;
--            field "|use:<backend>" = "<in use>|<capacity>": each backend's leases as of
--              the last call there (a full denial names the other backends that were
--              full then, so the caller does not ask each in turn);
--            field "|h:<member>" = "<backend>|<expiry>": a slot handed over and not yet
--              released (a renewal lists the caller's, whatever backend they are on, so a
--              lost message is found by any renewal)
--            field "|moved" = the instant the pool's recovery from a marker another
--              server wrote ends (below)
-- KEYS[3]  the pool's generation marker: a token written when its leases' state began,
--          with the Redis server that last wrote it (a Redis that restarted empty writes a
--          new one, and so does another server: generation.lua; it never expires)
--          (the keys share the pool's hash tag: one Redis Cluster slot)
-- ARGV     1 op: "acquire", "keep" (an acquire judged by the order only, whatever the
--            count: a recovering replica's start within the slots it held), "release",
--            "pass" (a release of handed slots the caller cannot use: handed on to the
--            others, never back to it), "renew" or "restore"
--          2 capacity C, 3 ttl_s, 4 replica, 5 entitled waiting (this replica's
--          floor-entitled requests waiting, not counting the one acquiring),
--          6 entitled (0/1, acquire), 7 now: "" to read the Redis server's clock (TIME),
--          or the caller's time (s), 8 seq: the call's number (rising with each call the
--          replica sends), 9 surplus waiting (this replica's other requests waiting, not
--          counting the one acquiring), 10 the hand-over channel's prefix ("" = publish
--          nothing: a replica finds what it was handed at its next renewal), 11 the
--          backend's name (what a hand-over message and the use record name),
--          12 the generation the caller last saw ("" = none), 13 a fresh token, written
--          as the generation if the marker is missing,
--          14.. members (acquire: one; the others: any)
-- returns  {granted (0/1), reason ("" | "full" | "order"), leases in use, now (a string),
--          {replica, member, …}: the slots this call handed over (on this backend),
--          {backend, member, …}: renew only: the slots handed to the caller, not released,
--          {backend, …}: a full denial only: the pool's other backends full as of their
--          last call,
--          renew and restore: how many of the members Redis did not hold,
--          the generation}
--
-- An acquire from a caller that saw another generation is refused ("lost"): Redis lost
-- the leases' state, and the count it would judge by misses every lease the replicas have
-- not put back yet. The caller keeps to what it held (as while Redis is unreachable) and
-- puts its leases back; so does every replica at its first call after the loss. A marker
-- another server wrote (a failover to a replica that may have missed the latest leases, a
-- restart) refuses every acquire in the pool for ttl_s / 2, whoever sends it, even a
-- replica that has seen no generation: two renewal periods, the grace a replica keeps to
-- what it held after a lost state, by which every live replica has renewed and so put
-- back the leases it holds ("keep" starts, within what a replica held, still run).
--
-- acquire grants a member that already holds a live lease again (a retry of a call that
-- timed out after it ran gets the first grant: one lease, not two), and otherwise grants
-- iff fewer than C leases are live and, for a request that is not floor-entitled, no
-- *other* replica has an entitled request waiting in the pool (fleet-wide
-- assured-first). An opportunistic start on a slot handed to its replica (the member
-- names it) is judged by that order too: the lease stays the replica's either way. A
-- denied request counts itself as waiting, in the same call: an entitled one holds the
-- others' opportunistic starts back at once.
--
-- Slots are handed over, not polled for: each slot a release frees, while a replica waits
-- for one, is leased to that replica in the same call — entitled waiters first, then the
-- others, round-robin among the replicas of a class — its count goes down by one, and the
-- slot is published on "<prefix><replica>" as "<backend> <member>". The replica starts
-- its next request there on the handed lease (an acquire naming it: renewed, and for an
-- opportunistic start judged by the order), and releases it
-- (handing it on) if it has none left to start. A message lost (a subscriber
-- reconnecting) is found by the replica's next renewal on any backend of the pool; a
-- handed slot no one takes expires with its ttl, or with the waiter's board entry if
-- that is sooner (a replica that died waiting holds nothing past ttl_s after its last
-- call). Only a slot a release frees is handed over, never one free for another reason:
-- after Redis was away, its leases have expired while their requests still run, until
-- their replicas restore them (a fresh start there is the documented brief overshoot; a
-- hand-over of every "free" slot at once would be C of them).
--
-- Leases not renewed within ttl_s expire: a dead replica's slots come back within ttl_s
-- of its last renewal. renew and restore put the caller's leases back whatever the count:
-- its requests run on them, whether Redis lost them (restarted without persistence, a
-- quick restart no call of the replica's met), they expired while it was paused, or they
-- were granted locally while Redis was unreachable (restore). A renewal lists only the
-- caller's running requests' leases, so the count is whole again within ttl_s / 4; the
-- reply says how many were missing. A replica's calls may reach Redis out of the order it sent them (one
-- connection each): a call numbered below the board entry's leaves the entry alone (it
-- carries older counts), so a late call cannot clear a request that a newer one announced.

local op = ARGV[1]
local capacity = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local replica = ARGV[4]
local waiting = tonumber(ARGV[5])
local entitled = ARGV[6] == '1'
local seq = tonumber(ARGV[8])
local surplus = tonumber(ARGV[9])
local channel = ARGV[10]
local backend = ARGV[11]

local now = tonumber(ARGV[7])
if now == nil then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)

-- the board's live entries (expired ones dropped): replica -> {entitled, expiry, seq,
-- surplus, seq as written} (an entry is written back with its seq's text: a Lua number
-- is written with 14 digits, and a seq of 16 — the HTTP guard's, from the wall clock's
-- microseconds — rounded up would stand above every newer call's); the use records: backend -> {in use, capacity}; the handed index: member ->
-- {backend, expiry}
local board, uses, index = {}, {}, {}
local turn = 0
local recovering = nil
local stored = redis.call('HGETALL', KEYS[2])
for i = 1, #stored, 2 do
  local name, value = stored[i], stored[i + 1]
  if name == '|turn' then
    turn = tonumber(value)
  elseif name == '|moved' then
    if tonumber(value) <= now then
      redis.call('HDEL', KEYS[2], name)
    else
      recovering = tonumber(value)
    end
  elseif string.sub(name, 1, 5) == '|use:' then
    local n, c = string.match(value, '^([^|]*)|(.*)$')
    uses[string.sub(name, 6)] = {tonumber(n), tonumber(c)}
  elseif string.sub(name, 1, 3) == '|h:' then
    local b, x = string.match(value, '^(.*)|([^|]*)$')
    if tonumber(x) <= now then
      redis.call('HDEL', KEYS[2], name)
    else
      index[string.sub(name, 4)] = {b, tonumber(x)}
    end
  else
    local e, x, s, o = string.match(value, '^([^|]*)|([^|]*)|([^|]*)|?(.*)$')
    x = tonumber(x)
    if x <= now then
      redis.call('HDEL', KEYS[2], name)
    else
      board[name] = {tonumber(e), x, tonumber(s), tonumber(o) or 0, s}
    end
  end
end

local function unindex(member)
  if index[member] then
    index[member] = nil
    redis.call('HDEL', KEYS[2], '|h:' .. member)
  end
end

local generation, moved = generation_of(KEYS[3], ARGV[13])
if moved then
  recovering = now + ttl / 2
  redis.call('HSET', KEYS[2], '|moved', recovering)
end
local stale = (ARGV[12] ~= '' and ARGV[12] ~= generation) or recovering ~= nil

local granted, reason, freed, lost = 0, '', 0, 0
if op == 'acquire' and stale then
  reason = 'lost'
  if entitled then
    waiting = waiting + 1
  else
    surplus = surplus + 1
  end
elseif op == 'acquire' or op == 'keep' then
  local live = redis.call('ZSCORE', KEYS[1], ARGV[14])
  local handed_here = string.find(ARGV[14], '|handed|', 1, true)
  if not entitled and not (live and not handed_here) then
    for other, entry in pairs(board) do
      if other ~= replica and entry[1] > 0 then
        reason = 'order'
      end
    end
  end
  if reason == '' and live then
    redis.call('ZADD', KEYS[1], now + ttl, ARGV[14])
    granted = 1
    unindex(ARGV[14])  -- a handed slot taken: its replica renews it from now on
  elseif reason == '' then
    if op == 'keep' or redis.call('ZCARD', KEYS[1]) < capacity then
      redis.call('ZADD', KEYS[1], now + ttl, ARGV[14])
      granted = 1
    else
      reason = 'full'
    end
  end
  if granted == 0 and entitled then
    waiting = waiting + 1
  elseif granted == 0 then
    surplus = surplus + 1
  end
elseif op == 'release' or op == 'pass' then
  for i = 14, #ARGV do
    freed = freed + redis.call('ZREM', KEYS[1], ARGV[i])
    unindex(ARGV[i])
  end
else  -- renew, restore: the caller's requests run on these, whatever Redis kept
  for i = 14, #ARGV do
    lost = lost + redis.call('ZADD', KEYS[1], now + ttl, ARGV[i])
  end
end

local mine = board[replica]
if mine and mine[3] > seq then
  -- a newer call's counts stand
elseif waiting > 0 or surplus > 0 then
  board[replica] = {waiting, now + ttl, seq, surplus, ARGV[8]}
  redis.call('HSET', KEYS[2], replica, waiting .. '|' .. (now + ttl) .. '|' .. ARGV[8] .. '|' .. surplus)
else
  board[replica] = nil
  redis.call('HDEL', KEYS[2], replica)
end

-- hand each slot the release freed to a replica waiting for one: entitled first,
-- round-robin
local handed = {}
local turned = false
while freed > 0 and redis.call('ZCARD', KEYS[1]) < capacity do
  freed = freed - 1
  local waiters = {}
  for _, class in ipairs({1, 4}) do
    for name, entry in pairs(board) do
      if entry[class] > 0 and not (op == 'pass' and name == replica) then
        waiters[#waiters + 1] = name
      end
    end
    if #waiters > 0 then
      table.sort(waiters)
      local to = waiters[turn % #waiters + 1]
      turn = turn + 1
      turned = true
      local entry = board[to]
      entry[class] = entry[class] - 1
      local member = to .. '|handed|' .. turn
      -- no later than the waiter's board entry: a replica that died waiting is handed
      -- nothing that outlives its own last call's ttl
      local expiry = math.min(now + ttl, entry[2])
      redis.call('ZADD', KEYS[1], expiry, member)
      redis.call('HSET', KEYS[2], '|h:' .. member, backend .. '|' .. expiry)
      if entry[1] > 0 or entry[4] > 0 then
        redis.call('HSET', KEYS[2], to, entry[1] .. '|' .. entry[2] .. '|' .. entry[5] .. '|' .. entry[4])
      else
        board[to] = nil
        redis.call('HDEL', KEYS[2], to)
      end
      if channel ~= '' then
        redis.call('PUBLISH', channel .. to, backend .. ' ' .. member)
      end
      handed[#handed + 1] = to
      handed[#handed + 1] = member
      break
    end
  end
  if #waiters == 0 then
    break
  end
end
if turned then
  redis.call('HSET', KEYS[2], '|turn', turn)
end

local in_use = redis.call('ZCARD', KEYS[1])
redis.call('HSET', KEYS[2], '|use:' .. backend, in_use .. '|' .. capacity)

local held = {}
if op == 'renew' then
  local prefix = replica .. '|handed|'
  local members = {}
  for member, _ in pairs(index) do
    if string.sub(member, 1, #prefix) == prefix then
      members[#members + 1] = member
    end
  end
  table.sort(members)
  for _, member in ipairs(members) do
    held[#held + 1] = index[member][1]
    held[#held + 1] = member
  end
end
local full = {}
if reason == 'full' then
  local names = {}
  for name, use in pairs(uses) do
    if name ~= backend and use[1] >= use[2] then
      names[#names + 1] = name
    end
  end
  table.sort(names)
  full = names
end
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000) + 1000)
redis.call('PEXPIRE', KEYS[2], math.ceil(ttl * 1000) + 1000)
return {granted, reason, in_use, tostring(now), handed, held, full, lost, generation}
