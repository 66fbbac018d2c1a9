-- fence: one step of the finish of a sharded crawl, whose shards are cleared one after the
-- other (each is another slot). The record under the crawl's own tag says where it stands,
-- and join.lua reads it: no worker joins between two shards' clearing.
--   prepare: no other finish under way and no worker joined lately (its first heartbeat, in
--            shard 0, may not be there yet): 'prepare <token> <deadline>'. The finishing
--            worker then checks every shard (nothing pending, leased or delayed) and that no
--            worker is alive;
--   commit:  the record is still 'prepare <token> ...': 'commit <token> <deadline>'. From
--            here the crawl is cleared whole: by this worker, or by one that joins after the
--            deadline (join.lua: 'complete');
--   done:    the record is 'commit <token> ...': 'done' (the crawl finished and was cleared;
--            its layout may change);
--   abort:   the record is 'prepare <token> ...': deleted (nothing was cleared).
-- KEYS[1] finish record  KEYS[2] joins
-- ARGV[1] the step  ARGV[2] the finish's token  ARGV[3] ms the finish may take from this step
-- Returns 1 when the step was made, 0 when the record did not allow it.
--- @include "time"
local now = now_ms()
local step, token, ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
if not (ms and string.match(token or '', '^%w+$')) then
  return redis.error_reply('ERR fence: bad arguments (a step, a token and a duration)')
end
local record = redis.call('GET', KEYS[1])
local phase, holder = string.match(record or '', '^(%a+) (%S+) %d+$')
local deadline = table.concat({'', token, string.format('%d', now + ms)}, ' ')
if step == 'prepare' then
  if phase or redis.call('ZCOUNT', KEYS[2], now, '+inf') > 0 then return 0 end
  redis.call('SET', KEYS[1], 'prepare' .. deadline)
elseif step == 'commit' then
  if phase ~= 'prepare' or holder ~= token then return 0 end
  if redis.call('ZCOUNT', KEYS[2], now, '+inf') > 0 then return 0 end
  redis.call('SET', KEYS[1], 'commit' .. deadline)
elseif step == 'done' then
  if phase ~= 'commit' or holder ~= token then return 0 end
  redis.call('SET', KEYS[1], 'done')
elseif step == 'abort' then
  if phase ~= 'prepare' or holder ~= token then return 0 end
  redis.call('DEL', KEYS[1])
else
  return redis.error_reply('ERR fence: unknown step ' .. tostring(step))
end
return 1
