-- floorguard: a state's generation marker that names the Redis server that wrote it, put
-- in front of acquire.lua and lease.lua (one copy; docs/replicas.md, "A store that lost
-- its data").
--
-- A marker is "<token>@<run id>": the token written when the state began, and the run id
-- (INFO server) of the Redis server that last wrote it. A marker missing (a Redis that
-- came back empty, an eviction) starts a new generation from the caller's fresh token. A
-- marker another server wrote starts one too, and says so (`moved`), unless this server
-- read the data back from its own append-only file (a restart with `appendonly yes`, not
-- promoted since: `second_repl_offset` -1). Else it is not the server that kept the state:
-- a replica promoted by a failover (replication is asynchronous: it may have missed the
-- latest takes and carry a lower count under the same token), or a restart from a
-- snapshot (which loses the writes after it). Either may have lost what it acknowledged,
-- so the callers treat it as a state lost outright. (An append-only file is trusted as
-- whole: run it with `appendfsync always`, or a crash may lose the last second's takes.)

local function generation_of(key, fresh)
  local server = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  local marker = redis.call('GET', key)
  local generation, by = fresh, server
  if marker then
    generation, by = string.match(marker, '^(.*)@(%x+)$')
    if not generation then
      generation, by = marker, server  -- written before markers named their server
    end
  end
  local moved = false
  if by ~= server then
    local info = redis.call('INFO', 'persistence', 'replication')
    moved = string.match(info, 'aof_enabled:(%d)') ~= '1'
      or string.match(info, 'second_repl_offset:(%-?%d+)') ~= '-1'
    if moved then
      generation = fresh
    end
  end
  local written = generation .. '@' .. server
  if marker ~= written then
    redis.call('SET', key, written)
  end
  return generation, moved
end
