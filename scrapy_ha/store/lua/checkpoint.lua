-- checkpoint: save a task's checkpoint, only while the lease of the page that wrote it is
-- current (a stale worker cannot overwrite a newer checkpoint).
-- Rule: a checkpoint never moves past a page of its chain that has not completed. A page's
-- checkpoint names the page it is about ("of") and the page to fetch next ("page"); the
-- saved checkpoint's "page" is the chain's first page not completed. A page ahead of it
-- (it finished while an earlier page was still running, or waits to retry) is kept aside
-- in the task's ahead hash; when the earlier page completes, the checkpoint moves over
-- every page completed ahead of it, in order. A page behind it (run again) never moves it
-- back. Mid-page progress ("skip") is kept for the first page not completed only.
-- A checkpoint without "of" (not written by the middleware) is saved as given.
-- KEYS[1] leases  KEYS[2] the task's checkpoint key  KEYS[3] the task's ahead hash
-- ARGV[1] entry id of the page  ARGV[2] its lease token  ARGV[3] checkpoint (JSON)
-- ARGV[4] time to live (ms)
-- Returns 1 when saved (or kept aside), 0 when the lease is stale, 2 when the page is
-- behind the checkpoint (not saved).
--- @include "lease"
local ttl = tonumber(ARGV[4])
if not ttl or ttl <= 0 then
  return redis.error_reply('ERR checkpoint: the time to live must be a positive number')
end
local ok, new = pcall(cjson.decode, ARGV[3])
if not ok or type(new) ~= 'table' then
  return redis.error_reply('ERR checkpoint: the checkpoint must be a JSON object')
end
local of = new['of']
if of ~= nil and (type(of) ~= 'number' or type(new['page']) ~= 'number') then
  return redis.error_reply('ERR checkpoint: "of" and "page" must be page numbers')
end
if not lease_current(KEYS[1], ARGV[1], ARGV[2]) then
  return 0
end
if of == nil then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ttl)
  return 1
end

-- the first page of the chain not completed: 1 when the task has no checkpoint yet, or a
-- finished one (it runs again); an unreadable checkpoint is replaced
local first = 1
local cur = redis.call('GET', KEYS[2])
if cur then
  local ok2, doc = pcall(cjson.decode, cur)
  if ok2 and type(doc) == 'table' and not doc['done'] and type(doc['page']) == 'number' then
    first = doc['page']
  elseif ok2 and type(doc) == 'table' and doc['done'] then
    redis.call('DEL', KEYS[3])
  end
end
local mid = new['skip'] ~= nil
if of < first then return 2 end
if of > first then
  if mid then return 2 end -- progress within a page ahead: it redoes its items if run again
  redis.call('HSET', KEYS[3], of, ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ttl)
  return 1
end

local saved = ARGV[3]
while not mid and not new['done'] and type(new['page']) == 'number' do
  local ahead = redis.call('HGET', KEYS[3], new['page'])
  if not ahead then break end
  redis.call('HDEL', KEYS[3], new['page'])
  local ok3, doc = pcall(cjson.decode, ahead)
  if not ok3 or type(doc) ~= 'table' then break end
  saved, new = ahead, doc
end
redis.call('SET', KEYS[2], saved, 'PX', ttl)
if new['done'] then
  redis.call('DEL', KEYS[3])
elseif redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
