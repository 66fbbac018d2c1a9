--- @include "time"
--- @include "number"
-- lib/types: the check that runs before a script's first write.
--
-- wrong_type(script, keys, types)
--   keys: the script's KEYS; types[i]: the Redis type keys[i] must have (nil: not checked).
--   Returns an error reply 'WRONGTYPE <script>: <key> holds a <type>' for the first key of
--   another type (a missing key is fine), or nil and the types read (found[i]: keys[i]'s
--   type, 'none' when it does not exist; nil when not checked), which tell a caller the
--   keys it need not read (a key that does not exist, and that the call does not make).
--   Rule: a key of the wrong type fails the call before any write, so the entry stays
--   where it was; the worker sets the key aside and retries the call.
local function wrong_type(script, keys, types)
  local found = {}
  for i = 1, #keys do
    local want = types[i]
    if want then
      local ty = redis_call('TYPE', keys[i])['ok']
      if ty ~= 'none' and ty ~= want then
        return redis.error_reply('WRONGTYPE ' .. script .. ': ' .. keys[i] .. ' holds a ' .. ty)
      end
      found[i] = ty
    end
  end
  return nil, found
end

-- aside_name(key)
--   Returns the name a key of the wrong type is renamed to: "<key>:corrupt:<seconds>", with
--   ".<n>" added when that name is taken (an earlier copy is never overwritten). It shares
--   the key's hash tag, so the rename stays in its slot.
local function aside_name(key)
  local stamp = key .. ':corrupt:' .. int_str(math_floor(now_ms() / 1000))
  local target, n = stamp, 0
  while redis_call('EXISTS', target) == 1 do
    n = n + 1
    target = stamp .. '.' .. n
  end
  return target
end

-- keep_wide(key, kind, count)
--   Makes key, a sorted set (kind 'zset') or a hash ('hash'), a skip list or a hash table if
--   it is a small one kept as a listpack (ziplist on Redis 6.2), when count (the entries
--   the caller knows it holds) is nil or at least 32: a member or field of 1,024 bytes,
--   longer than zset-max-listpack-value and hash-max-listpack-value (64 bytes by default),
--   added and taken away in the same call, so nobody sees it; the key stays converted
--   until it is deleted (Redis never converts one back while it lives). Above 1,024 set by
--   an operator, nothing is converted, and a call pays the two commands.
--   Rule: for the keys a sync call writes and reads at many places that stay under the
--   listpack limits (128 entries) in most crawls: the frontier's ready set (a member per
--   back queue), the leased set, the leases hash and the payloads (an entry per lease in
--   flight; payloads shorter than 64 bytes keep the payload hash a listpack too). A
--   listpack is a flat array that a write or a lookup searches, and a write moves, from
--   end to end (about 70 instructions an entry); a skip list or a hash table costs a few
--   pointers. With 64 leases in flight the listpacks cost a tenth of a call
--   (bench/script_cost.py --inflight); below 32 leases the conversion would cost a lone
--   worker more than it saves (its leases acked every round, the keys deleted and made
--   again each time). Their extra bytes per entry are a few kilobytes for 128 entries. A
--   key made again (deleted when it emptied, or reloaded from disk as a listpack) is
--   converted by the next call that has something to do (one with nothing to do writes
--   none of them, and leaves them as they are). (Its figures are in its body: the sync script's main
--   function holds at most 200 locals in its EVAL form, the libraries' included.)
local function keep_wide(key, kind, count)
  if count and count < 32 then return end
  local enc = redis_call('OBJECT', 'ENCODING', key)
  if enc ~= 'listpack' and enc ~= 'ziplist' then return end
  local wide = string.rep('~', 1024)
  -- refused over maxmemory in a call that wrote nothing before (a script's first write
  -- that may grow memory is refused): the key stays as it is, the call goes on
  if kind == 'zset' then
    if type(redis_pcall('ZADD', key, '0', wide)) == 'number' then
      redis_call('ZREM', key, wide)
    end
  elseif type(redis_pcall('HSET', key, wide, '')) == 'number' then
    redis_call('HDEL', key, wide)
  end
end
