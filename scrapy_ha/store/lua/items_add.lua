-- items_add: items that no page yielded (a spider's start() yields items too) added to the
-- crawl's item stream as they come: no lease fences them.
-- Rule: lib/commit (an entry holds one item, field 'i'); the items of a page never come
-- here, they go with the page's ack. A worker numbers its loose items 1, 2, ... under its
-- run's nonce, and 'sent' keeps the newest number added (field "<nonce>:i"): a call sent
-- again after its reply was lost adds none of them twice.
-- KEYS[1] the crawl's item stream
-- KEYS[2] stats  KEYS[3] stats:min  KEYS[4] stats:domain (lib/stats: the counter items)
-- KEYS[5] (optional) sent: a worker's nonce -> its numbers (lib/senders prunes them)
-- ARGV[1] "<worker nonce> <number of the first item>", or '-' (not numbered), then the
--         items (the codec's tagged JSON, which is neither); without either, every ARGV is
--         an item (the call of an earlier version)
-- Returns the number of items the call names that the stream holds now (added by it, or by
-- an earlier call whose reply was lost)
--- @include "time"
--- @include "types"
--- @include "stats"
local err = wrong_type('items_add', KEYS, {'stream', 'hash', 'hash', 'hash', 'hash'})
if err then return err end
local nonce, first = string.match(ARGV[1] or '', '^([%w]+) (%d+)$')
if nonce and not KEYS[5] then
  return redis.error_reply('ERR items_add: numbered items without the sent key')
end
local head = (nonce or ARGV[1] == '-') and 1 or 0 -- the arguments before the items
local field = nonce and (nonce .. ':i')
local have = field and (tonumber(redis.call('HGET', KEYS[5], field)) or 0) or 0
first = tonumber(first) or 0
local added = 0
for i = head + 1, #ARGV do
  if not nonce or first + i - 2 > have then -- the item numbered first + (i - 2)
    redis.call('XADD', KEYS[1], '*', 'i', ARGV[i])
    added = added + 1
  end
end
if nonce and added > 0 then
  redis.call('HSET', KEYS[5], field, string.format('%d', first + #ARGV - 2))
end
count('items', added)
write_stats(KEYS[2], KEYS[3], KEYS[4], now_ms())
return #ARGV - head
