-- lib/stats: the crawl-wide counters, kept by the script that makes each transition (no
-- extra round trip; the reader is scrapy_ha/ops/stats.py). A script tallies its events in memory
-- with count() and writes them once, at its end, with write_stats(): one HINCRBY per counter
-- that moved, however many requests the call handled.
--   stats   hash: counter -> total (enqueued, filtered, start_duplicates, acked, reclaimed,
--           poison, retried, retried:<class>, dead, dead:<class>, retry_ok, retry_dead,
--           requeued, purged, items, items_refused, items_consumed, items_consumed:<group>,
--           checkpoints_dropped)
--   minutes hash: '<event>:<minute>' -> count in that minute (minute = server ms // 60000)
--           for the events of MINUTE_EVENTS, and '<event>:<class>:<minute>' for those of
--           CLASS_MINUTE_EVENTS; '<name>:last' -> the newest minute of each
--   domains hash: '<domain>\t<event>' -> count, for the events of DOMAIN_EVENTS; field '~'
--           holds ENCODING (see there)
--- @include "time"
--- @include "number"

-- MINUTE_EVENTS: the events with per-minute buckets (rates, an ETA, the dashboard's charts;
-- requeued and purged say what an operator did today; items, the item stream's pace).
local MINUTE_EVENTS = {acked = true, enqueued = true, retried = true, dead = true,
  requeued = true, purged = true, items = true}
-- CLASS_MINUTE_EVENTS: events whose per-class counters have per-minute buckets too (the
-- dashboard's retries and dead letters per minute by class): a bucket per class that
-- occurred in a minute, a dozen classes at most.
local CLASS_MINUTE_EVENTS = {retried = true, dead = true}
-- DOMAIN_EVENTS: the events counted per domain.
local DOMAIN_EVENTS = {acked = true, enqueued = true, retried = true, dead = true}
-- MINUTES_KEPT: buckets are kept for a day, the longest rate window a reader asks for.
local MINUTES_KEPT = 1440
-- PRUNE_CHUNK: fields per HDEL when a gap of hours leaves many buckets to drop at once.
local PRUNE_CHUNK = 500
-- ENCODING: the value of the domains hash's field '~', longer than Redis's
-- hash-max-listpack-value (64 bytes by default): its presence keeps the hash a hash table.
-- A call updates a field per domain it saw; in a listpack (a small hash's compact form,
-- up to 128 fields) each update is a linear search, the largest cost of a call that touched
-- 10 domains of 50 (measured: a twentieth of the sync script's work). A hash table costs
-- about 60 bytes more per field: a few kilobytes per crawl.
local ENCODING = 'kept by scrapy-ha: this field makes Redis keep the hash as a hash table'

-- The tally of this script call: counter -> n, and event -> domain -> n.
local TALLY, DOMAIN_TALLY = {}, {}

-- domain_of(payload)
--   Returns the host of a stored request's URL (lower case, without user info or port):
--   the payload is the codec's JSON, which starts with {"v":<n>,"u":"<url>"; '-' when it
--   does not (a corrupt entry), or when the host holds a space or a brace. Only the
--   payload's first bytes are read. Workers send the host of each new request (the same
--   rule: scrapy_ha/store/wire.py url_host); this reads it for entries stored without it.
local function domain_of(payload)
  local auth = str_match(payload or '', '^{"v":%d+,"u":"%a[%w+.-]*://([^/?#"\\]*)')
  if not auth or str_find(auth, '[%s{}]') then return '-' end
  if auth ~= '' and not str_find(auth, '[@:%u]') then return auth end -- the usual host
  local host = str_match(auth, '([^@]*)$')
  host = str_match(host, '^(%[[^%]]*%])') or str_match(host, '^([^:]*)')
  if host == '' then return '-' end
  return string.lower(host) -- (rare: no local of its own, the script holds 200 at most)
end

-- count(event, n, domain, class)
--   Tallies n events (n may be 0); with domain, in that domain's counts too (for the events
--   of DOMAIN_EVENTS); with class, in '<event>:<class>' too.
local function count(event, n, domain, class)
  if n == 0 then return end
  TALLY[event] = (TALLY[event] or 0) + n
  if class then
    local c = event .. ':' .. class
    TALLY[c] = (TALLY[c] or 0) + n
  end
  if domain and DOMAIN_EVENTS[event] then
    local t = DOMAIN_TALLY[event] or {}
    DOMAIN_TALLY[event] = t
    t[domain] = (t[domain] or 0) + n
  end
end

-- add(hash, field, n): HINCRBY that never fails: a value overwritten with garbage restarts.
local function add(hash, field, n)
  local v = redis_pcall('HINCRBY', hash, field, num_str(n))
  if type(v) == 'number' then return v end
  redis_call('HSET', hash, field, num_str(n))
  return n
end

-- prune(minutes, event, minute)
--   Rule: a day of buckets. When bucket minute of event is new, the buckets that left the
--   day since the newest one before it (event:last) are deleted, so none older than
--   MINUTES_KEPT minutes stays, however long the crawl pauses.
--   event:last is data: one that is not a finite number, or not a minute of the past
--   (below 0 or after minute), counts as missing; and the loop runs MINUTES_KEPT + 1 times
--   at most. Before, '-inf' or -1e300 made the loop endless (m + 1 == m past 2^53), after
--   the script had written: Redis BUSY, and SCRIPT KILL refused.
local function prune(minutes, event, minute)
  local last = finite(redis_call('HGET', minutes, event .. ':last'))
  if last and (last < 0 or last > minute) then last = nil end
  if last == minute then return end
  redis_call('HSET', minutes, event .. ':last', minute)
  local to = minute - MINUTES_KEPT - 1
  local from = to
  if last then
    last = math_floor(last)
    from, to = last - MINUTES_KEPT, math_min(last, to)
  end
  local fields = {}
  to = math_min(to, from + MINUTES_KEPT)
  for m = from, to do
    fields[#fields + 1] = event .. ':' .. m
    if #fields == PRUNE_CHUNK or m == to then
      redis_call('HDEL', minutes, unpack(fields))
      fields = {}
    end
  end
end

-- write_stats(stats, minutes, domains, now)
--   KEYS: the stats, stats:min and stats:domain hashes (the caller's KEYS[i])
--   Writes this call's tally at server time now (ms); call it once, after the last count().
local function write_stats(stats, minutes, domains, now)
  local minute = math_floor(now / 60000)
  local minute_s
  for name, n in pairs(TALLY) do
    add(stats, name, n)
    local bucketed = MINUTE_EVENTS[name] or CLASS_MINUTE_EVENTS[str_match(name, '^(%a+):')]
    if bucketed then
      minute_s = minute_s or int_str(minute)
      if add(minutes, name .. ':' .. minute_s, n) == n then prune(minutes, name, minute) end
    end
  end
  if next(DOMAIN_TALLY) then redis_call('HSETNX', domains, '~', ENCODING) end
  for event, t in pairs(DOMAIN_TALLY) do
    for domain, n in pairs(t) do add(domains, domain .. '\t' .. event, n) end
  end
end
