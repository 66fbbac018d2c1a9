-- sync: one round trip of a worker's main loop, in this order:
--   1. enqueue new requests (parent fence + dupefilter check + push to pending),
--   2. ack finished leases (fenced by token; children of step 1 are already durable), and
--      give back the leases the worker no longer wants (to pending, at their place),
--   3. promote due delayed entries, then lease up to n pending entries.
-- The input is checked before the first write: the script applies whole or not at all.
-- Data read that is garbage never stops it half-way: a pending member without an entry id
-- is set aside in the dead-letter queue as 'corrupt', a restore score that is not a number
-- restores at priority 0, a lease record that cannot be read refuses its ack (stale).
-- A pending entry is one sorted-set member "<id> <payload>" (lib/member); leased, delayed
-- and dead entries keep their payload in the payload hash under their id.
-- KEYS[1] pending    KEYS[2] payload   KEYS[3] dupefilter (lib/seen)  KEYS[4] seq
-- KEYS[5] leased     KEYS[6] leases    KEYS[7] expiries    KEYS[8] delayed
-- KEYS[9] delayed_sc KEYS[10] lseq     KEYS[11] gates      KEYS[12] dead
-- KEYS[13] dead_info
-- KEYS[14] stats     KEYS[15] stats:min KEYS[16] stats:domain (lib/stats)
-- KEYS[17] retried (entry id -> retries: an ack of one counts as retry_ok)
-- KEYS[18] paused (set by `scrapy-ha pause`: nothing is leased)
-- KEYS[19] sent: a worker's nonce -> the number of its newest child stored (see below)
-- KEYS[20] limits     KEYS[21] polite (lib/polite: per-domain limits and their state)
-- KEYS[22] held (lib/held): why a delayed entry waits without an attempt: an entry held
--          back here for its domain's limits is marked, a promoted entry's mark goes
-- KEYS[23] items: the crawl's item stream (lib/commit: a page's items come with its ack)
-- KEYS[24] (optional) this worker's grant: the "<id> <token>" pairs this call leases, kept
--          for the worker's lease keeper so that it renews them even when the worker's
--          event loop is blocked before it reads this reply (see renew.lua)
-- then the checkpoint keys the acks name (lib/commit), if any
-- then the bitmaps of the dupefilter, when it is a Bloom filter (lib/seen; KEYS[3] is then
--          its meta hash), or its time slices with HA_DUPEFILTER_TTL (their hash and their
--          sets, lib/aged)
-- ARGV[1] number of requests to enqueue  ARGV[2] number of acks
-- ARGV[3] number of leases wanted        ARGV[4] lease length (ms)
-- ARGV[5] most delayed entries to promote
-- ARGV[6] a random nonce of this call (no spaces): part of every token it gives, so that a
--         token is never given twice, even after a flush or a failover that lost counters
-- ARGV[7] order within a priority: 'fifo' or 'lifo', then optionally ' fifo' or ' lifo':
--         the order of start requests kept in their own queue (marked 's' below), which go
--         after every other request of their priority
-- ARGV[8] '-' or "<worker nonce>.<n>": this server must hold that worker's children up to
--         number n (KEYS[19]) or the call is refused whole, before any write, with the
--         error "LOSTCHILDREN <its number> <n>": a server that failed over to a replica
--         which lacked the newest writes takes no ack (and no child) from the worker until
--         the worker has stored again the children it still needs (see _outbox.Retained)
-- ARGV[9] number of leases to give back: the buffered requests that new ones the worker
--         keeps crowded out (see scheduler/keep.py), given back in the call that stores
--         those, so that Redis never holds both (a worker killed in between would leave
--         both to redo)
-- then ARGV[1] requests, one argument each: "<priority>[s][@<age>] <parent> <taken> <sent>
--   <fingerprint length (2 digits)><fingerprint><payload>": age (ms) is how long ago the
--   request may have been seen and still be a duplicate (meta ha_recrawl_after; none: the
--   crawl's HA_DUPEFILTER_TTL, or for ever, lib/aged); parent is '-' (none) or
--   "<entry id>/<lease token>" of the page that yielded it; taken is '-' or "<entry id>/<lease
--   token>" made by the worker, which already handed the request to its engine: stored
--   LEASED to it under that id and token (not pending) and marked handed, its download
--   waiting for this reply; or "=<entry id>/<lease token>": the same, not marked handed (the
--   worker keeps the request in its buffer: a new request of a LIFO crawl, see _keep.py);
--   sent is '-' or "<worker nonce>.<n>": the worker numbers its children 1, 2, ... in the
--   order it sends them, so a request whose n is not above the number KEYS[19] holds for
--   that nonce was stored (or filtered, or refused) by an earlier call whose reply was lost,
--   and is skipped: a resent round enqueues and counts nothing twice; length 00 = never
--   filtered; e.g. "-3 - - 9f3a.17 12<12 bytes>{...}"
-- then ARGV[2] acks, one argument each: "<entry id> <lease token>", followed by what the
--   page commits with its ack, if anything: its items and its task's checkpoint (lib/commit;
--   a checkpoint names its keys by their index in KEYS, after KEYS[23] or KEYS[24])
-- then ARGV[9] leases to give back, one argument each: "<entry id> <lease token>" (a stale
--   token gives nothing back; see lib/release)
-- then the dupefilter's spec: 'set', 'set <ttl ms>' or 'bloom ...' (lib/seen)
-- Priorities are clamped (lib/priority).
-- Returns {now_ms, added, acked, stale, pending, leased, delayed, refused, set_aside,
--          roots_seen, paused (1 or 0), n, d, head (the score of the first pending entry
--          left, '' when none: the worker holds back a buffered request it outranks),
--          released (leases given back), items (added to the stream by accepted acks),
--          checkpoints (saved by them),
--          domain1, open_at1, ... (n closed domain gates; expired ones are deleted),
--          dropped_id1, ... (d taken requests not stored: duplicates, or refused),
--          id1, token1, payload1, expiries1, wait1, score1, ...}
--   (refused: children whose parent's lease is no longer current: not enqueued, the
--   dupefilter untouched; set_aside: pending members without an entry id, dead-lettered;
--   roots_seen: requests without a parent (start requests) the dupefilter had seen, so
--   that a worker joining a crawl can say how many of its start requests were not new
--   (counted as start_duplicates, apart from the links of pages, counted as filtered);
--   payload '' when the entry has no payload: the worker dead-letters it as corrupt;
--   expiries: how many of the entry's leases expired before, so the worker can run a
--   suspect alone and only the request that kills workers is counted as poison;
--   wait: ms before the request may start, for its domain's rate limit, lib/polite;
--   score: its pending score, so that the worker's buffer keeps Redis's order across calls).
-- With limits in force, the lease step reads at most SCAN_FACTOR entries per lease wanted
-- (never the whole queue): a request of a domain at its limit is moved to the delayed set
-- until it may go (counted as domain_limited), so other domains' requests behind it are
-- leased at once and no domain starves behind a limited one.
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "member"
--- @include "number"
--- @include "priority"
--- @include "counter"
--- @include "deadletter"
--- @include "stats"
--- @include "polite"
--- @include "release"
--- @include "held"
--- @include "commit"
--- @include "seen"
-- SCAN_FACTOR: pending entries looked at per lease wanted when limits are in force: a few
-- limited requests at the head cost no lease, a queue full of them costs a bounded scan.
local SCAN_FACTOR = 4
local now = now_ms()
local n_enq, n_ack, n_lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n_back = tonumber(ARGV[9])
local lease_ms, n_promote = tonumber(ARGV[4]), tonumber(ARGV[5])
local order, start_order = string.match(ARGV[7] or '', '^(%a+) ?(%a*)$')
local nonce, lifo, start_lifo = ARGV[6], order == 'lifo', start_order == 'lifo'
local expect_id, expect_n = string.match(ARGV[8] or '', '^([%w]+)%.(%d+)$')
local seen_spec = ARGV[#ARGV]
if not (n_enq and n_ack and n_lease and lease_ms and n_promote and n_back)
    or #ARGV ~= 10 + n_enq + n_ack + n_back
    or not string.match(nonce or '', '^[%w]+$') or not (lifo or order == 'fifo')
    or not (start_order == '' or start_lifo or start_order == 'fifo')
    or not (expect_id or ARGV[8] == '-') then
  return redis.error_reply('ERR sync: bad arguments (counts, nonce, order or expect)')
end
local paused = redis.call('EXISTS', KEYS[18])
if paused == 1 then n_lease = 0 end

-- 1. read and check every request before any write
local reqs = {}
for i = 1, n_enq do
  local e = ARGV[9 + i]
  local prio, start, age, pid, ptok, tid, ttok, sid, sn, rest =
    string.match(e, '^(%-?%d+)(s?)@?(%d*) ([^ /]+)/?(%S*) ([^ /]+)/?(%S*) ([^ .]+)%.?(%d*) ()')
  local fl = rest and tonumber(string.sub(e, rest, rest + 1))
  if not (prio and fl and (pid == '-' or ptok ~= '')
      and (tid == '-' or (ttok ~= '' and tid ~= '=' and tid ~= '=-'))
      and (sid == '-' or sn ~= ''))
      or #e < rest + 1 + fl then
    return redis.error_reply('ERR sync: malformed request argument ' .. i)
  end
  reqs[i] = {
    prio = clamp_priority(tonumber(prio)), start = start == 's' and start_order ~= '',
    age = tonumber(age),
    pid = pid ~= '-' and pid or nil, ptok = ptok,
    tid = tid ~= '-' and string.match(tid, '^=?(.*)$') or nil, ttok = ttok,
    kept = string.sub(tid, 1, 1) == '=',
    sid = sid ~= '-' and sid or nil, sn = tonumber(sn),
    fp = string.sub(e, rest + 2, rest + 1 + fl), fl = fl,
    payload = string.sub(e, rest + 2 + fl)}
end

local err = wrong_type('sync', KEYS, {'zset', 'hash', nil, nil, 'zset', 'hash', 'hash', 'zset',
  'hash', nil, 'hash', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash', nil, 'hash', 'hash', 'hash',
  'hash', 'stream'})
if err then return err end
local acks, bad = commit_acks(KEYS, ARGV, 9 + n_enq, n_ack)
if bad then return bad end
local seen
if n_enq > 0 then
  seen, err = seen_open('sync', KEYS[3], seen_spec, KEYS, now)
  if err then return err end
end
-- The grant, KEYS[24], is there when the caller names a worker: told apart by its name
-- (<crawl>:grant:<worker>) from the checkpoint keys an ack may add after the fixed keys.
local crawl_base = string.sub(KEYS[1], 1, #KEYS[1] - #'pending')
local GRANT = KEYS[24] and string.sub(KEYS[24], 1, #crawl_base + 6) == crawl_base .. 'grant:'
  and KEYS[24] or nil
if expect_id then
  local have = tonumber(redis.call('HGET', KEYS[19], expect_id)) or 0
  if have < tonumber(expect_n) then
    return redis.error_reply(string.format('LOSTCHILDREN %s %s', int_str(have), expect_n))
  end
end

-- A taken request is stored leased to the worker that took it; the same argument sent again
-- (the reply to an earlier call was lost) finds its lease and changes nothing.
-- A request numbered by its worker (sent) and not above that worker's number in KEYS[19]
-- was handled by an earlier call whose reply was lost: it is not stored or counted again
-- (reported added; a taken one whose lease is gone, dropped).
local added, refused, roots_seen = 0, 0, 0
local dropped, taken = {}, {}
local sent = {} -- worker nonce -> its number in KEYS[19] before this call
if n_enq > 0 then
  local base = take(KEYS[4], n_enq)
  for i = 1, n_enq do
    local r = reqs[i]
    local sid = r.sid
    if sid and not sent[sid] then sent[sid] = tonumber(redis.call('HGET', KEYS[19], sid)) or 0 end
    if r.tid and lease_current(KEYS[6], r.tid, r.ttok) then
      added = added + 1 -- stored by an earlier call whose reply was lost: keep it granted
      taken[#taken + 1] = r
    elseif sid and r.sn <= sent[sid] then
      if r.tid then dropped[#dropped + 1] = r.tid else added = added + 1 end
    elseif r.pid and not lease_current(KEYS[6], r.pid, r.ptok) then
      refused = refused + 1
      if r.tid then dropped[#dropped + 1] = r.tid end
    elseif r.fl == 0 or seen_add(seen, r.fp, r.age) then
      local seq = base + i
      local score
      if r.start then score = pending_score(r.prio, seq, start_lifo, true)
      else score = pending_score(r.prio, seq, lifo) end
      if r.tid then
        redis.call('ZADD', KEYS[5], now + lease_ms, r.tid)
        -- marked handed: it is in the worker's engine already (its expiry counts to poison);
        -- a kept one is marked when the worker hands it out (renew.lua)
        local record = lease_record(r.ttok, int_str(score), domain_of(r.payload))
        if not r.kept then record = lease_mark_handed(record) end
        redis.call('HSET', KEYS[6], r.tid, record)
        redis.call('HSET', KEYS[2], r.tid, r.payload)
        taken[#taken + 1] = r
      else
        push_pending(KEYS[1], int_str(seq), score, r.payload)
      end
      added = added + 1
      count('enqueued', 1, domain_of(r.payload))
    else
      if r.tid then dropped[#dropped + 1] = r.tid end
      if r.pid then
        count('filtered', 1)
      else
        roots_seen = roots_seen + 1
        count('start_duplicates', 1)
      end
    end
  end
  local newest = {}
  for i = 1, n_enq do
    local r = reqs[i]
    if r.sid and r.sn > (newest[r.sid] or sent[r.sid]) then newest[r.sid] = r.sn end
  end
  for sid, n in pairs(newest) do redis.call('HSET', KEYS[19], sid, n) end
  seen_close(seen)
end

-- 2. acks: a malformed ack or an unreadable lease record is refused as stale; an accepted
-- ack commits what its page yielded (lib/commit), a stale one commits nothing
local acked, stale, committed, cps = 0, 0, 0, 0
local retrying = n_ack > 0 and redis.call('EXISTS', KEYS[17]) == 1 -- else no HDEL per ack
local slots = n_ack > 0 and redis.call('EXISTS', KEYS[21]) == 1 -- leases may hold a slot
for i = 1, n_ack do
  local id, tok = acks[i].id, acks[i].tok
  local v = id and lease_current(KEYS[6], id, tok)
  if v then
    local n_items, n_cp = commit_apply(KEYS[23], acks[i])
    committed, cps = committed + n_items, cps + n_cp
    count('acked', 1, lease_domain(v))
    if retrying then count('retry_ok', redis.call('HDEL', KEYS[17], id)) end
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[7], id)
    if slots then polite_free(KEYS[21], id) end
    acked = acked + 1
  else
    stale = stale + 1
    commit_refuse(acks[i])
  end
end

local released = 0
for i = 1, n_back do
  local id, tok = string.match(ARGV[9 + n_enq + n_ack + i], '^(%S+) (%S+)$')
  if id and release_lease(KEYS[1], KEYS[5], KEYS[6], KEYS[2], KEYS[21], id, tok) then
    released = released + 1
  end
end

local out = {now, added, acked, stale, 0, 0, 0, refused, 0, roots_seen, paused, 0, #dropped, '',
  released, committed, cps}
local NG = 12
if redis.call('HLEN', KEYS[11]) > 0 then
  local gates = redis.call('HGETALL', KEYS[11])
  for i = 1, #gates, 2 do
    local open_at = tonumber(gates[i + 1])
    if not open_at or open_at <= now then
      redis.call('HDEL', KEYS[11], gates[i])
    else
      out[#out + 1] = gates[i]
      out[#out + 1] = gates[i + 1]
      out[NG] = out[NG] + 1
    end
  end
end

for _, id in ipairs(dropped) do out[#out + 1] = id end

-- A pending member that has no entry id cannot be leased, acked or renewed: set it aside.
local function set_aside(m)
  local id = int_str(take(KEYS[4], 1) + 1)
  dead_letter(KEYS[12], KEYS[13], id, {class = 'corrupt',
    reason = 'corrupt queue entry: a pending member without an entry id'}, now)
  count('dead', 1, '-', 'corrupt')
  redis.call('HSET', KEYS[2], id, m)
  out[9] = out[9] + 1
end

-- The grant: the pairs this call leases (taken requests included), for the lease keeper.
local grant = (n_lease > 0 or #taken > 0) and GRANT or nil
if grant then
  redis.call('DEL', grant)
  for _, r in ipairs(taken) do redis.call('HSET', grant, r.tid, r.ttok) end
end

if n_lease > 0 then
  local due = redis.call('ZRANGEBYSCORE', KEYS[8], '-inf', now, 'LIMIT', 0, n_promote)
  for _, id in ipairs(due) do
    local sc = tonumber(redis.call('HGET', KEYS[9], id) or '') or 0
    back_to_pending(KEYS[1], KEYS[2], id, sc)
    redis.call('ZREM', KEYS[8], id)
    redis.call('HDEL', KEYS[9], id)
    held_clear(KEYS[22], id)
  end
  local polite = polite_open(KEYS[20], KEYS[21], now, lease_ms)
  local scan = polite and n_lease * SCAN_FACTOR or n_lease
  local items = redis.call('ZRANGE', KEYS[1], 0, scan - 1, 'WITHSCORES')
  local tbase, expiry, given, seen, parked = nil, now + lease_ms, 0, 0, 0
  for i = 1, #items / 2 do
    if given >= n_lease then break end
    seen = i
    local m, sc = items[i * 2 - 1], items[i * 2]
    local id, payload = split_member(m)
    if id == '' then
      set_aside(m)
    else
      local domain = domain_of(payload)
      local wait, due = 0, nil
      if polite then wait, due = polite_admit(polite, id, domain) end
      if due then -- its domain is at its limit: it waits in the delayed set, in its place
        redis.call('HSET', KEYS[2], id, payload)
        redis.call('ZADD', KEYS[8], due, id)
        redis.call('HSET', KEYS[9], id, sc)
        held_mark(KEYS[22], id, 'limit', domain)
        parked = parked + 1
      else
        tbase = tbase or take(KEYS[10], n_lease)
        given = given + 1
        local tok = nonce .. '-' .. int_str(tbase + given)
        redis.call('ZADD', KEYS[5], expiry, id)
        redis.call('HSET', KEYS[6], id, lease_record(tok, sc, domain))
        redis.call('HSET', KEYS[2], id, payload)
        if grant then redis.call('HSET', grant, id, tok) end
        out[#out + 1] = id
        out[#out + 1] = tok
        out[#out + 1] = payload
        out[#out + 1] = select(2, expiry_counts(redis.call('HGET', KEYS[7], id)))
        out[#out + 1] = wait
        out[#out + 1] = sc
      end
    end
  end
  if seen > 0 then redis.call('ZREMRANGEBYRANK', KEYS[1], 0, seen - 1) end
  count('domain_limited', parked)
end
if grant then redis.call('PEXPIRE', grant, lease_ms) end
polite_write(KEYS[21])
write_stats(KEYS[14], KEYS[15], KEYS[16], now)
out[5] = redis.call('ZCARD', KEYS[1])
out[6] = redis.call('ZCARD', KEYS[5])
out[7] = redis.call('ZCARD', KEYS[8])
out[14] = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2] or ''
return out
