-- revisit: end a finished request's lease by sending it back to the delayed set, due again
-- after its revisit interval, its attempts reset (never both, never neither), fenced by its
-- token. The page is done: it counts as acked (and retry_ok if it had been retried), and it
-- commits what an ack would (lib/commit: the items it yielded, its task's checkpoint); or
-- its visit failed (ARGV[5] 'failed', its retries spent): no ack, the URL revisited still.
-- The entry keeps its id and its priority; once due it goes after the other requests of its
-- priority, in the order revisits are due (lib/revisit: revisit_score), into its host's
-- back queue (lib/frontier's restore record: the score and the host); its payload is the
-- new one (with what is kept of the URL between visits: validators, signature, interval).
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] delayed  KEYS[4] delayed_sc  KEYS[5] payload
-- KEYS[6] retried  KEYS[7] expiries
-- KEYS[8] stats  KEYS[9] stats:min  KEYS[10] stats:domain (lib/stats)
-- KEYS[11] polite (lib/polite: the lease's concurrency slot is freed)
-- KEYS[12] revisits  KEYS[13] revisit_urls (lib/revisit)
-- KEYS[14] items: the crawl's item stream (lib/commit)
-- KEYS[15] held (lib/held): a revisit waits without an attempt, marked 'revisit <domain>'
-- KEYS[16] dupefilter (lib/seen: the set, or the Bloom filter's meta hash)
-- KEYS[17] revisit_alloc (lib/revisit: adaptive revisits' budget)
-- KEYS[18] the back queues' prefix  KEYS[19] ready  KEYS[20] waiting  KEYS[21] queued
--          (lib/frontier: a back queue waiting for the freed slot goes back to ready)
-- KEYS[22] dead (lib/revisit: an entry dead-lettered does not hold its URL)
-- then the checkpoint keys the ack names (lib/commit), if any, then the dupefilter's own
-- (a Bloom filter's bitmaps, or the set's time slices; lib/seen)
-- ARGV[1] the ack: "<entry id> <lease token>", and what the page commits (lib/commit)
-- ARGV[2] interval (ms; below 0: the entry is no longer revisited, it leaves, below)
-- ARGV[3] new payload
-- ARGV[4] the URL's fingerprint ('' for none: no one-revisit rule, not kept seen)
-- ARGV[5] what the visit found: new, changed, unchanged, not_modified or unknown; or
--         failed (its retries spent: it goes on being revisited, and counts no ack)
-- ARGV[6] bytes a 304 saved (0 otherwise)  ARGV[7] the interval's histogram bucket
-- ARGV[8] adaptive revisits: what this one changes of the intervals' load (visits a
-- second)  ARGV[9] of the configured intervals'  ARGV[10] the budget (0: that configured
-- sum)  ARGV[11] the multiplier to start from  ARGV[12], ARGV[13] what the worker's state
-- says the entry holds in the load and the configured sum (with ARGV[8], ARGV[9]: its new
-- share; the sums move from what its record holds, below)  ARGV[14], ARGV[15] the
-- range the multiplier is kept in (lib/revisit: revisit_allocate); all eight '' for fixed
-- ones. Every number must be finite: a NaN or an infinity is refused before any write.
-- ARGV[16] '1': the URL is recorded as seen again (below); '0': the crawl does not
--          deduplicate (BaseDupeFilter): its fingerprint still keeps one revisit per URL
-- ARGV[17] the crawl's order within a priority ('fifo' or 'lifo', then optionally that of
--          its start queue): the score of a back queue woken here follows from it
-- ARGV[18] the priority of its next visit ('' = keep its lease's), clamped (lib/priority):
--          the request's own, without the lowering of this visit's retries
-- ARGV[19] the dupefilter's spec (lib/seen)
-- Counts acked (per domain) and retry_ok if it had been retried, or for a failed visit
-- neither but retry_dead if it had been (its retries failed: every retried request that
-- ends counts one of the two); revisited and revisited:<found>, revisit_saved (bytes),
-- revisit_iv:<bucket> and revisit_iv_ms (the intervals' sum), items (lib/commit); a double
-- (lib/revisit: another entry revisits the URL) counts revisit_double, and acked as above
-- (not for a failed visit), and ends like an ack (its items committed too); a stale token
-- commits nothing (items_refused).
-- Rule kept: a URL revisited is seen again (its fingerprint is recorded as seen now,
-- lib/seen; not in a crawl without a dupefilter, ARGV[16] '0'): with a dupefilter's age
-- (HA_DUPEFILTER_TTL) it stays seen for that age after each visit, so a link to it queues
-- no second copy if the age is not shorter than the interval (a copy queued later ends as
-- a double, above, and leaves the revisits set if it was one of them).
-- Rule kept: adaptive revisits spend the budget (lib/revisit: revisit_allocate), counting
-- a revisit once, when it is scheduled, and a URL once: a double takes out what its entry
-- held (lib/revisit: revisit_release), fixed settings or adaptive; what each entry holds is
-- recorded (revisit_hold), for a dead letter to take out (dead.lua) and a requeue to put
-- back (requeue.lua), and a visit moves the sums from that record to its new share (before:
-- from the worker's state, which an earlier version's fixed visit or a changed rule left
-- apart from the record: the sums drifted from the records, the load below 0).
-- Rule kept: an entry that leaves the revisits (interval < 0: a page no longer matched by
-- HA_REVISIT, its lease ended as an ack) leaves the revisits set and the budget, its
-- record 'e:<id>' deleted (lib/revisit: revisit_release), counted as revisit_left; its URL
-- leaves revisit_urls if this entry held it (before, `seen check` said it revisited).
-- Rule kept: the script reads and checks what it needs before its first write, and fails
-- after it on nothing it reads (lib/revisit: garbage in the budget is repaired), so that a
-- lease never ends half way (its domain's slot freed and never counted back).
-- Returns {the due time (server ms), items committed, checkpoints saved, the multiplier
-- (a string; '' for fixed revisits, a stale token or a double)}: the due time is 0 when
-- the token is stale (nothing changes), -1 for a double (its lease ended as an ack), -2
-- for an entry that left (its lease ended as an ack).
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "number"
--- @include "stats"
--- @include "polite"
--- @include "seen"
--- @include "revisit"
--- @include "commit"
--- @include "held"
--- @include "frontier"
local interval, saved = finite(tonumber(ARGV[2])), finite(tonumber(ARGV[6]))
if not (interval and saved and ARGV[3] ~= '' and ARGV[5] ~= '' and ARGV[7] ~= '') then
  return redis.error_reply('ERR revisit: interval, payload, outcome, saved and bucket')
end
local adaptive = ARGV[8] ~= ''
local alloc = {}
for i, name in ipairs({'load', 'base', 'budget', 'first', 'held', 'held_base', 'lowest',
    'highest'}) do
  alloc[name] = finite(tonumber(ARGV[7 + i]))
end
if adaptive and not (alloc.load and alloc.base and alloc.budget and alloc.first and alloc.held
    and alloc.held_base and alloc.lowest and alloc.highest and alloc.lowest > 0
    and alloc.lowest <= alloc.highest) then
  return redis.error_reply('ERR revisit: load, base, budget, multiplier, held load and the '
    .. "multiplier's range must be finite numbers")
end
local err = wrong_type('revisit', KEYS, {'zset', 'hash', 'zset', 'hash', 'hash', 'hash', 'hash',
  'hash', 'hash', 'hash', 'hash', 'zset', 'hash', 'stream',
  'hash', nil, 'hash', nil, 'zset', 'zset', 'string', 'zset'})
if err then return err end
local acks, bad = commit_acks(KEYS, ARGV, 0, 1)
if bad then return bad end
local a = acks[1]
if not a.id then return redis.error_reply('ERR revisit: a malformed ack') end
local now = now_ms()
local seen
seen, err = seen_open('revisit', KEYS[16], ARGV[19], KEYS, now)
if err then return err end
local id, fp = a.id, ARGV[4]
local v = lease_current(KEYS[2], id, a.tok)
if not v then
  commit_refuse(a)
  write_stats(KEYS[8], KEYS[9], KEYS[10], now)
  return {0, 0, 0, ''}
end
local n_items, n_cp = commit_apply(KEYS[14], a)
local domain = lease_domain(v)
local retried = redis.call('HDEL', KEYS[6], id)
if ARGV[5] ~= 'failed' then
  count('acked', 1, domain)
  count('retry_ok', retried)
else -- a failed visit is no ack: its retries were spent, and failed (retry_dead)
  count('retry_dead', retried)
end
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[7], id)
polite_free(KEYS[11], {id})
local due, mu = -1, ''
local leaves = interval < 0 -- no longer revisited: it ends as an ack, out of the revisits
if leaves then
  due = -2
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[12], id)
  count('revisit_left', 1)
  revisit_release(KEYS[17], id) -- (fixed now, it may hold what an adaptive run recorded)
  if fp ~= '' and redis.call('HGET', KEYS[13], fp) == id then
    redis.call('HDEL', KEYS[13], fp) -- its URL is revisited no more (`seen check`)
  end
elseif revisit_claim(KEYS[13], KEYS[1], KEYS[3], KEYS[12], KEYS[22], id, fp) then
  due = now + interval
  redis.call('ZADD', KEYS[3], int_str(due), id)
  local score, prio = lease_score(v) or 0, tonumber(ARGV[18] or '')
  if prio then score = with_priority(score, clamp_priority(prio)) end
  redis.call('HSET', KEYS[4], id, restore_value(revisit_score(score, due), domain))
  redis.call('HSET', KEYS[5], id, ARGV[3])
  revisit_due(KEYS[12], id, due, now, KEYS[3])
  held_mark(KEYS[15], id, 'revisit', domain)
  if fp ~= '' and ARGV[16] ~= '0' then seen_touch(seen, fp) end
  count('revisited', 1, nil, ARGV[5])
  count('revisit_saved', saved)
  count('revisit_iv', 1, nil, ARGV[7])
  count('revisit_iv_ms', interval)
  if adaptive then
    -- the sums move from what its record says it holds (none: revisited at a fixed interval
    -- until the crawl was made adaptive, it counts whole, as at a first visit), not from
    -- what the worker read in its state (the interval of a fixed visit of an earlier
    -- version, which left the record; a configured interval changed since)
    local rec = redis.call('HGET', KEYS[17], 'e:' .. id)
    local r_load, r_base = string.match(rec or '', '^(%S+) (%S+)$')
    r_load, r_base = finite(tonumber(r_load)) or 0, finite(tonumber(r_base)) or 0
    -- its new share (what the worker counts: 1 / its interval) is what its record holds
    -- next, so that a double, a dead letter or a departure takes out what the sums got
    local share = finite(alloc.load + alloc.held) or 0
    alloc.load, alloc.base = share - r_load, alloc.base + alloc.held_base - r_base
    mu = string.format('%.17g', revisit_allocate(KEYS[17], KEYS[12], alloc, alloc.first,
      alloc.lowest, alloc.highest))
    revisit_hold(KEYS[17], id, share, alloc.base)
  else -- fixed: it holds nothing in the budget (a crawl made adaptive again counts it whole)
    revisit_release(KEYS[17], id)
  end
else
  redis.call('HDEL', KEYS[5], id)
  redis.call('ZREM', KEYS[12], id) -- (a revisit before: no longer one of the revisits)
  count('revisit_double', 1)
  -- it takes out what its record holds, fixed settings or adaptive (one revisited at a
  -- fixed interval before the crawl was made adaptive holds nothing: takes nothing out)
  revisit_release(KEYS[17], id)
end
seen_close(seen)
local lifo, start_lifo = order_flags(ARGV[17])
frontier_open(KEYS[18], KEYS[19], KEYS[20], KEYS[21], lifo, start_lifo)
polite_woken(KEYS[11], frontier_wake_one)
polite_write(KEYS[11])
write_stats(KEYS[8], KEYS[9], KEYS[10], now)
return {due, n_items, n_cp, mu}
