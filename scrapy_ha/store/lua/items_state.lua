-- items_state: the crawl's item stream at one instant, for the operator's tools (a stream
-- that does not exist is empty and has no group: no error in a pipelined read).
-- Rule: lib/stream (a group's backlog: its entries pending plus those not delivered yet).
-- KEYS[1] the crawl's item stream  KEYS[2] its set-aside stream (items_aside)
-- Returns {length, set-aside records, name1, consumers1, pending1, lag1, ...}: lag is -1
--         when the server cannot say (Redis before 7.0, or a group whose count of entries
--         read is unknown)
--- @include "stream"
local aside = 0
if redis.call('TYPE', KEYS[2])['ok'] == 'stream' then aside = redis.call('XLEN', KEYS[2]) end
if redis.call('TYPE', KEYS[1])['ok'] ~= 'stream' then return {0, aside} end
local out = {redis.call('XLEN', KEYS[1]), aside}
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local f = stream_fields(g)
  out[#out + 1] = f['name']
  out[#out + 1] = f['consumers']
  out[#out + 1] = f['pending']
  out[#out + 1] = tonumber(f['lag']) or -1
end
return out
