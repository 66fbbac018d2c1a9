-- lib/commit: what a page commits with its ack: the items it yielded (to the crawl's item
-- stream) and its task's checkpoint, in the script call that acks it, under its lease.
-- Rule: a page's items count once. They are added only by the call whose ack of the page is
-- accepted (its lease token current, checked by the caller); an ack refused as stale commits
-- nothing, so a page whose lease was lost (its worker frozen, killed, too slow) and that
-- another worker redoes has the items of the run that acked it, and of that run alone.
-- An ack argument is "<entry id> <lease token>", or, when the page commits something,
-- "<entry id> <lease token> <n> <c> " followed by n records (its items) and, when c is not
-- '-', one more (the checkpoint); a record is "<length>:<bytes>". c is '-' or "<k>/<ttl>":
-- the call's KEYS[k] is the task's checkpoint key, KEYS[k + 1] its ahead hash (lib/checkpoint),
-- ttl the checkpoint's time to live in ms. A stream entry is "<ms>-<seq>" -> field 'i', the
-- item as the worker's codec wrote it.
--- @include "stats"
--- @include "checkpoint"

-- commit_records(arg, at, n)
--   Reads n records "<length>:<bytes>" of arg from position at.
--   Returns the list and the position after the last, or nil when arg does not hold them.
local function commit_records(arg, at, n)
  local out = {}
  for i = 1, n do
    local len, start = string.match(arg, '^(%d+):()', at)
    if not len then return nil end
    local stop = start + tonumber(len) - 1
    if stop > #arg then return nil end
    out[i] = string.sub(arg, start, stop)
    at = stop + 1
  end
  return out, at
end

-- commit_checkpoint(keys, a, c, arg, at)
--   Reads the checkpoint of ack a ("<k>/<ttl>" then its record at position at) into a; a
--   checkpoint that cannot be saved (not a JSON object cjson reads, a bad time to live) is
--   dropped (a.dropped), the ack goes on without it (refusing the ack would refuse it at
--   every try, as stale, until the page is dead-lettered as poison).
--   Returns the position after it; nil when malformed; or false and an error reply when the
--   task's checkpoint key or its ahead hash holds another type (the call fails before any
--   write, its reply naming the key: the worker sets it aside and sends the call again, see
--   lib/types; a call that wrote the items first would add them again each time).
local function commit_checkpoint(keys, a, c, arg, at)
  local k, ttl = string.match(c, '^(%d+)/(%d+)$')
  k = tonumber(k)
  if not (k and keys[k] and keys[k + 1]) then return nil end
  local doc, after = commit_records(arg, at, 1)
  if not doc then return nil end
  local new, err = checkpoint_doc(doc[1], ttl, keys[k], keys[k + 1])
  if new == false then return false, err end
  if not new then
    a.dropped = true
    return after
  end
  a.cp, a.cpa, a.doc, a.new, a.ttl = keys[k], keys[k + 1], doc[1], new, tonumber(ttl)
  return after
end

-- commit_acks(keys, argv, first, n)
--   Reads the n ack arguments argv[first + 1] .. argv[first + n] (see above), before the
--   call's first write. Returns a list of acks {id, tok, items[, cp, cpa, doc, new, ttl]}
--   (id nil: a malformed ack, refused as stale, committing nothing), or nil and an error
--   reply (an ahead hash of the wrong type).
local function commit_acks(keys, argv, first, n)
  local acks = {}
  for i = 1, n do
    local arg = argv[first + i]
    local id, tok, rest = string.match(arg, '^(%S+) (%S+)()')
    local a = {items = {}}
    if id and rest > #arg then
      a.id, a.tok = id, tok
    elseif id then
      local cnt, c, at = string.match(arg, '^ (%d+) (%S+) ()', rest)
      local items, after
      if cnt then items, after = commit_records(arg, at, tonumber(cnt)) end
      if items and c ~= '-' then
        local err
        after, err = commit_checkpoint(keys, a, c, arg, after)
        if after == false then return nil, err end
      end
      if items and after == #arg + 1 then
        a.id, a.tok, a.items = id, tok, items
      else
        a = {items = {}} -- malformed: refused whole
      end
    end
    acks[i] = a
  end
  return acks
end

-- commit_apply(stream, a)
--   KEYS: stream, the crawl's item stream (the caller's KEYS[i])
--   Adds ack a's items to the stream and saves its checkpoint; call it while a's lease is
--   current, before the ack ends it. Returns the items added, and 1 when it carried a
--   checkpoint (saved, kept aside, or behind the task's: lib/checkpoint), else 0 (a
--   checkpoint dropped as unreadable is counted as checkpoints_dropped).
local function commit_apply(stream, a)
  for _, item in ipairs(a.items) do
    redis.call('XADD', stream, '*', 'i', item)
  end
  count('items', #a.items)
  if a.dropped then count('checkpoints_dropped', 1) end
  if a.doc then
    checkpoint_save(a.cp, a.cpa, a.doc, a.new, a.ttl)
    return #a.items, 1
  end
  return #a.items, 0
end

-- commit_refuse(a)
--   Counts the items of an ack refused as stale: nothing of it is written.
local function commit_refuse(a)
  count('items_refused', #a.items)
end
