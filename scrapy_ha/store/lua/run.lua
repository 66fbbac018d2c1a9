-- run: open or end a run of the crawl.
-- Rule (a run): a run is the life of a crawl from a start on an empty crawl to the moment a
-- worker sees it finished. A worker that joins a crawl with nothing pending, leased or
-- delayed starts the next run when the last one ended (a worker saw it finish) or when no
-- other worker of that run is alive (its workers were all killed at the end); any other
-- worker joins the run in progress (or resumes the last, open again: work pushed or requeued
-- after its end). A run's workers are those that opened it or joined it
-- here ('m:<worker id>' fields), not every heartbeat: a worker registers when it joins the
-- crawl (join.lua) before it calls this, so two workers restarted together on a run whose
-- workers all died would otherwise each find the other alive and both join the dead run.
-- Start requests that are dont_filter are seeded once per run (the worker puts the run
-- number in their dupefilter fingerprints, scheduler/admission.py); what was seen before
-- stays seen.
-- A run records the crawl's acks when it began (acked0), so that the pace of a run begun less
-- than a minute ago counts its own acks, not those its minute's bucket holds of the run before.
-- KEYS[1] run (hash: n, open, started, ended, ends, acked0 ('<n>:<acks>'), m:<worker id> -> the
-- run it opened or joined)
-- KEYS[2] workers  KEYS[3] ready  KEYS[4] leased  KEYS[5] delayed  KEYS[6] waiting (lib/frontier:
-- a back queue holding requests is in ready or in waiting)  KEYS[7] stats ('acked', 'dead')
-- ARGV[1] 'open': ARGV[2] worker id, ARGV[3] heartbeat (ms), ARGV[4] requests the crawl
--         holds outside these keys (the other shards of a sharded crawl; 0 when unsharded),
--         ARGV[5] acks counted outside these keys (the other shards' stats; 0 when unsharded)
--         Returns {the run's number, 1 when this call started it else 0}.
-- ARGV[1] 'end': ARGV[2] requests held outside these keys, as above; ARGV[3] requests
--         acked or dead-lettered outside these keys (the run's 'ends' records the crawl's
--         at its end). Returns 1 when the run ended now (nothing pending, leased or
--         delayed, and no other worker ended it with no request ended since), else 0.
--- @include "time"
--- @include "types"
--- @include "number"
local err = wrong_type('run', KEYS, {'hash', 'zset', 'zset', 'zset', 'zset', 'zset', 'hash'})
if err then return err end
local mode = ARGV[1]
local elsewhere = tonumber(ARGV[mode == 'open' and 4 or 2] or '')
local opening = mode == 'open' and tonumber(ARGV[3] or '') and tonumber(ARGV[5] or '')
if not (elsewhere and (mode == 'end' or opening)) then
  return redis.error_reply('ERR run: bad arguments (mode, worker, heartbeat, elsewhere, acked)')
end
local now = now_ms()
local active = elsewhere + redis.call('ZCARD', KEYS[3]) + redis.call('ZCARD', KEYS[4])
  + redis.call('ZCARD', KEYS[5]) + redis.call('ZCARD', KEYS[6])
if mode == 'end' then
  if active > 0 then return 0 end
  local counts = redis.call('HMGET', KEYS[7], 'acked', 'dead')
  local ends = (tonumber(counts[1] or '') or 0) + (tonumber(counts[2] or '') or 0)
    + (tonumber(ARGV[3] or '') or 0)
  local was = redis.call('HMGET', KEYS[1], 'open', 'ends')
  -- ended already by another worker that closed on the finished crawl first, and no request
  -- acked or dead-lettered since (work pushed or requeued after that end and crawled by a
  -- worker that stayed ends the run again, at its own close)
  if was[1] == '0' and tonumber(was[2] or '') == ends then return 0 end
  redis.call('HSET', KEYS[1], 'open', 0, 'ended', int_str(now), 'ends', int_str(ends))
  return 1
end

-- The workers of run n alive now, other than this one; members gone (or of an earlier
-- run) are dropped, so the hash holds no more members than live workers.
local function others_alive(n, worker)
  local fields = redis.call('HGETALL', KEYS[1])
  local alive = 0
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    local member = string.match(name, '^m:(.+)$')
    if member and member ~= worker then
      local beat = tonumber(redis.call('ZSCORE', KEYS[2], member) or '')
      if tonumber(value) == n and beat and beat > now then
        alive = alive + 1
      else
        redis.call('HDEL', KEYS[1], name)
      end
    end
  end
  return alive
end

local worker = ARGV[2]
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), worker)
local run = redis.call('HMGET', KEYS[1], 'n', 'open')
local n = tonumber(run[1] or '') or 0
local others = n > 0 and others_alive(n, worker) or 0
if n > 0 and (active > 0 or (run[2] == '1' and others > 0)) then
  -- (an ended run with work put back after its end, pushed or requeued: resumed, open again)
  redis.call('HSET', KEYS[1], 'm:' .. worker, n, 'open', 1)
  return {n, 0}
end
if n > 0 then others_alive(n + 1, worker) end -- drops every member of the runs before
-- (a count overwritten by hand reads as none: the pace then counts from the next minute)
local acked = tonumber(redis.call('HGET', KEYS[7], 'acked') or '0')
redis.call('HSET', KEYS[1], 'n', n + 1, 'open', 1, 'started', int_str(now), 'm:' .. worker, n + 1)
if acked then -- '<run>:<acks>': a run opened by a worker before acked0 reads as not recorded
  redis.call('HSET', KEYS[1], 'acked0', (n + 1) .. ':' .. int_str(acked + tonumber(ARGV[5])))
else
  redis.call('HDEL', KEYS[1], 'acked0')
end
-- a crawl that holds requests and no run yet (written before runs were kept) is in run 1
return {n + 1, active > 0 and 0 or 1}
