-- lib/checkpoint: a paginated task's checkpoint, saved only under the lease of the page that
-- wrote it (the caller checks the lease; see checkpoint.lua and lib/commit).
-- Rule: a checkpoint never moves past a page of its chain that has not completed. A page's
-- checkpoint names the page it is about ("of") and the page to fetch next ("page"); the
-- saved checkpoint's "page" is the chain's first page not completed. A page ahead of it
-- (it finished while an earlier page was still running, or waits to retry) is kept aside
-- in the task's ahead hash; when the earlier page completes, the checkpoint moves over
-- every page completed ahead of it, in order. A page behind it (run again) never moves it
-- back. Mid-page progress ("skip") is kept for the first page not completed only. A task
-- whose checkpoint is missing takes the page that comes as its checkpoint (see below).
-- A checkpoint without "of" (not written by the middleware) is saved as given.

-- checkpoint_doc(doc, ttl, cp, ahead)
--   doc: the checkpoint (JSON text); ttl: its time to live in ms (a number or its text);
--   cp, ahead: the task's checkpoint key and ahead hash.
--   Returns the decoded checkpoint and the ttl as a number; nil and an error reply for
--   input that cannot be saved; false and an error reply 'WRONGTYPE checkpoint: <key> holds
--   a <type>' when cp is not a string or ahead not a hash (garbage: the worker sets the key
--   it names aside, lib/types). Call it before the script's first write.
local function checkpoint_doc(doc, ttl, cp, ahead)
  ttl = tonumber(ttl)
  if not ttl or ttl <= 0 then
    return nil, redis.error_reply('ERR checkpoint: the time to live must be a positive number')
  end
  local ok, new = pcall(cjson.decode, doc)
  if not ok or type(new) ~= 'table' then
    return nil, redis.error_reply('ERR checkpoint: the checkpoint must be a JSON object')
  end
  local of = new['of']
  if of ~= nil and (type(of) ~= 'number' or type(new['page']) ~= 'number') then
    return nil, redis.error_reply('ERR checkpoint: "of" and "page" must be page numbers')
  end
  for key, want in pairs({[cp] = 'string', [ahead] = 'hash'}) do
    local ty = redis.call('TYPE', key)['ok']
    if ty ~= 'none' and ty ~= want then
      return false, redis.error_reply('WRONGTYPE checkpoint: ' .. key .. ' holds a ' .. ty)
    end
  end
  return new, ttl
end

-- checkpoint_save(cp, ahead, doc, new, ttl)
--   KEYS: cp, the task's checkpoint key (a string); ahead, its ahead hash (the caller's KEYS)
--   doc: the checkpoint as JSON text, new: the same decoded by checkpoint_doc, ttl: ms.
--   Saves it by the rule above; returns 1 when saved (or kept aside), 2 when the page is
--   behind the checkpoint (not saved).
local function checkpoint_save(cp, ahead, doc, new, ttl)
  local of = new['of']
  if of == nil then
    redis.call('SET', cp, doc, 'PX', ttl)
    return 1
  end
  -- the first page of the chain not completed: 1 when the task has a finished checkpoint
  -- (it runs again). A task without one is at page 1, or lost it mid-chain (its TTL ran
  -- out while the crawl was paused, evicted, reset by an operator): a page after the first
  -- then becomes the checkpoint (else every later page would wait in the ahead hash for
  -- ever, done included); so does a task whose checkpoint is unreadable (garbage written
  -- over it: it is replaced). The price: a page 2 that completes before page 1 of a new
  -- chain moves it past page 1, whose items a restart from the checkpoint alone (the queue
  -- lost as well, in that window) would not redo.
  local first = of
  local cur = redis.call('GET', cp)
  if cur then
    local ok, old = pcall(cjson.decode, cur)
    if ok and type(old) == 'table' and old['done'] then
      first = 1
      redis.call('DEL', ahead)
    elseif ok and type(old) == 'table' and type(old['page']) == 'number' then
      first = old['page']
    end
  end
  local mid = new['skip'] ~= nil
  if of < first then return 2 end
  if of > first then
    if mid then return 2 end -- progress within a page ahead: it redoes its items if run again
    redis.call('HSET', ahead, of, doc)
    redis.call('PEXPIRE', ahead, ttl)
    return 1
  end
  local saved = doc
  while not mid and not new['done'] and type(new['page']) == 'number' do
    local later = redis.call('HGET', ahead, new['page'])
    if not later then break end
    redis.call('HDEL', ahead, new['page'])
    local ok, next_doc = pcall(cjson.decode, later)
    if not ok or type(next_doc) ~= 'table' then break end
    saved, new = later, next_doc
  end
  redis.call('SET', cp, saved, 'PX', ttl)
  if new['done'] then
    redis.call('DEL', ahead)
  elseif redis.call('EXISTS', ahead) == 1 then
    redis.call('PEXPIRE', ahead, ttl)
  end
  return 1
end
