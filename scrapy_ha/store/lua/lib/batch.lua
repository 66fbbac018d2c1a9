-- lib/batch: one command over many arguments (Lua's unpack passes at most about 8,000
-- values: a call that leases, acks or adds thousands of queues at once splits its writes).

-- BATCH_ARGS: arguments per command at most: half Lua's limit (7,999 measured on Redis
-- 7.0), and a command that long is still short work for Redis.
local BATCH_ARGS = 4000

-- batched(command, key, args, step, flags)
--   Runs command on key with the values of the list args, step at a time kept together (2
--   for score, member pairs), in as few commands as BATCH_ARGS allows, flags (a list, may
--   be nil) before the values of each. Returns the replies joined: the sum of integer
--   replies, the concatenation of list replies (HMGET).
local function batched(command, key, args, step, flags)
  local n = #args
  local per = math_floor(BATCH_ARGS / step) * step
  if n <= per and not flags then  -- the usual call: one command, its reply as it is
    return redis_call(command, key, unpack(args))
  end
  local sum, list = 0, nil
  for first = 1, n, per do
    local last = math_min(n, first + per - 1)
    local reply
    if flags then
      local call = {}
      for i, f in ipairs(flags) do call[i] = f end
      for i = first, last do call[#call + 1] = args[i] end
      reply = redis_call(command, key, unpack(call))
    else
      reply = redis_call(command, key, unpack(args, first, last))
    end
    if type(reply) == 'table' then
      list = list or {}
      for _, v in ipairs(reply) do list[#list + 1] = v end
    else
      sum = sum + (tonumber(reply) or 0)
    end
  end
  return list or sum
end
