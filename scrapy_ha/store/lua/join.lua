-- join: a worker joins its crawl, before its first heartbeat; one call under the crawl's own
-- tag. Rules:
--   a finish is all or nothing: while the last worker of a sharded crawl checks and clears
--   its shards one after the other (fence.lua), no worker joins; one that comes waits, and
--   completes the clearing itself once the finish's deadline passed (its worker died);
--   a crawl's layout (its shard count) changes only once the crawl finished: a worker with
--   another count is refused while the crawl runs, or keeps its state (SCHEDULER_PERSIST);
--   a worker's field in 'sent' goes once its worker has been gone long enough (lib/senders:
--   an unsharded crawl; sharded ones do not number their children).
-- KEYS[1] shards: the crawl's layout, '<count>' or '<count> <span>' (absent: one shard)
-- KEYS[2] finish: the finish record ('prepare|commit <token> <deadline ms>', 'done', or
--         'joined <worker>': the first worker that joined the crawl after it finished)
-- KEYS[3] where the worker registers: the heartbeats of an unsharded crawl (workers), the
--         joins of a sharded one (its heartbeats are in shard 0, another slot)
-- KEYS[4] senders  KEYS[5] sent
-- KEYS[6..] the keys of an unsharded crawl: one of them there means the crawl is in Redis,
--         unsharded (no layout key)
-- ARGV[1] worker id  ARGV[2] its shard count  ARGV[3] ms its registration lasts
-- ARGV[4] its sender nonce ('-': none, a sharded crawl)
-- ARGV[5] the layout this worker may replace ('-': none): the worker checked that the
--         crawl, finished, keeps nothing there that its own layout would not read
-- ARGV[6] ms a worker's number in 'sent' is kept after it was seen gone (lib/senders)
-- Returns {'joined', layout replaced ('' if none), span, done}: span is the number of shards
--         of the layout now (the count, or more: shards an earlier run kept things on); done
--         is 1 if the crawl had finished (its 'done' record becomes 'joined <worker>');
--         {'wait', ms}: a finish is under way, join again within ms;
--         {'complete', token}: a finish decided to clear every shard and its worker stopped
--         before it was done: clear them under this token (then record it done), join again;
--         {'other', layout, done (1 or 0)}: the crawl is in Redis with another layout.
--- @include "time"
--- @include "senders"
local now = now_ms()
local count, ttl, grace = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[6])
if not (count and count >= 1 and ttl and grace) then
  return redis.error_reply('ERR join: bad arguments (the shard count, a TTL and a grace)')
end

local record = redis.call('GET', KEYS[2])
local phase, token, deadline = string.match(record or '', '^(%a+) (%S+) (%d+)$')
if phase then
  if tonumber(deadline) > now then return {'wait', tonumber(deadline) - now} end
  if phase == 'commit' then return {'complete', token} end
  redis.call('DEL', KEYS[2]) -- a finish that died deciding: it cleared nothing
  record = nil
end

local stored = redis.call('GET', KEYS[1])
local layout = stored
if not layout and #KEYS >= 6 and redis.call('EXISTS', unpack(KEYS, 6, #KEYS)) > 0 then
  layout = '1'
end
local had = layout and tonumber(string.match(layout, '^(%d+)')) or count
local had_span = layout and tonumber(string.match(layout, '^%d+ (%d+)$')) or had
local replaced = ''
if had ~= count then
  if record ~= 'done' or ARGV[5] ~= layout then
    return {'other', layout, record == 'done' and 1 or 0}
  end
  replaced = layout
end
local span = count
if count > 1 and had > 1 then span = math.max(count, had_span) end
if count == 1 then
  if stored then redis.call('DEL', KEYS[1]) end
else
  local value = span > count and string.format('%d %d', count, span) or tostring(count)
  if value ~= stored then redis.call('SET', KEYS[1], value) end
end
if record == 'done' then -- it runs again; leave.lua writes it back if this worker is
  redis.call('SET', KEYS[2], 'joined ' .. ARGV[1]) -- refused before any other joins
elseif record then
  redis.call('DEL', KEYS[2])
end

redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
if ARGV[4] ~= '-' then
  local old = sender_nonce(redis.call('HGET', KEYS[4], ARGV[1]))
  if old and old ~= ARGV[4] then redis.call('HDEL', KEYS[5], old) end -- its earlier run's
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[4])
  prune_senders(KEYS[4], KEYS[5], KEYS[3], now, grace)
end
return {'joined', replaced, span, record == 'done' and 1 or 0}
