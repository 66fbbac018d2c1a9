-- set_aside: move the keys of the crawl that hold the wrong type of data out of the way,
-- each checked and renamed in one step: two workers that find the same key both call this,
-- and the second finds it gone (never "no such key"), and a key written again meanwhile
-- with the right type is never renamed.
-- KEYS[1], KEYS[2], ... the crawl's keys; ARGV[1], ARGV[2], ... the type each must have
-- ('hash', 'zset', ...), in the same order; a type ending in '!' (the keys that name the
-- back queues) writes the key typed 'marker' when its key is renamed, in this same step:
-- a relink of the back queues is owed (store/frontier.py), whoever does it
-- Returns {key1, type1, ...}: each key renamed to "<key>:corrupt:<seconds>" (".<n>" added
-- if that name is taken: an earlier copy is never overwritten, lib/types), and the type it
-- had.
--- @include "types"
--- @include "counter"
if #KEYS ~= #ARGV then
  return redis.error_reply('ERR set_aside: one type per key')
end
local out = {}
local marker, owed = nil, false
for i, key in ipairs(KEYS) do
  local want = ARGV[i]
  local relink = string.sub(want, -1) == '!'
  if relink then want = string.sub(want, 1, -2) end
  if want == 'marker' then
    marker = key
  else
    local actual = redis_call('TYPE', key)['ok']
    if actual ~= 'none' and actual ~= want then
      redis_call('RENAME', key, aside_name(key))
      out[#out + 1] = key
      out[#out + 1] = actual
      owed = owed or relink
    end
  end
end
if owed and marker then take(marker, 1) end -- (lib/counter: garbage there restarts it)
return out
