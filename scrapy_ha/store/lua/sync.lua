-- sync: one round trip of a worker's main loop, in this order:
--   1. enqueue new requests (parent fence + dupefilter check + push to their back queue),
--   2. ack finished leases (fenced by token; children of step 1 are already durable), and
--      give back the leases the worker no longer wants (to their back queue, at their place),
--   3. promote due delayed entries, then lease up to n pending entries.
-- The input is checked before the first write: the script applies whole or not at all.
-- Data read that is garbage never stops it half-way: an element of a back queue without an
-- entry id is set aside in the dead-letter queue as 'corrupt', a back queue that is not a
-- list is renamed aside (lib/frontier), a restore score that is not a number restores at
-- priority 0, a lease record that cannot be read refuses its ack (stale).
-- Pending requests wait in one back queue per host and priority (lib/frontier): the lease
-- takes the heads of the ready queues in Scrapy's order and never reads a request of a
-- queue that waits (its host behind a closed gate or at its limits). Leased, delayed and
-- dead entries keep their payload in the payload hash under their id.
-- KEYS[1] the back queues' prefix '<prefix>:{<tag>}:q:': every back queue is named from
--         it and so shares the tag of the other keys (its slot on a cluster; lib/frontier)
-- KEYS[2] payload   KEYS[3] dupefilter (lib/seen)  KEYS[4] seq
-- KEYS[5] leased     KEYS[6] leases    KEYS[7] expiries    KEYS[8] delayed
-- KEYS[9] delayed_sc KEYS[10] lseq     KEYS[11] gates      KEYS[12] dead
-- KEYS[13] dead_info
-- KEYS[14] stats     KEYS[15] stats:min KEYS[16] stats:domain (lib/stats)
-- KEYS[17] retried (entry id -> retries: an ack of one counts as retry_ok)
-- KEYS[18] paused (set by `scrapy-ha pause`: nothing is leased)
-- KEYS[19] sent: a worker's nonce -> the number of its newest child stored (see below)
-- KEYS[20] limits     KEYS[21] polite (lib/polite: per-domain limits and their state)
-- KEYS[22] ready      KEYS[23] waiting  KEYS[24] queued (lib/frontier)
-- KEYS[25] held (lib/held): why a delayed entry waits without an attempt; a promoted
--          entry's mark goes
-- KEYS[26] items: the crawl's item stream (lib/commit: a page's items come with its ack)
-- KEYS[27] gate log (gate.lua): the call returns the gates changed since ARGV's gate number
-- KEYS[28] (optional) this worker's grant: the "<id> <token>" pairs this call leases, kept
--          for the worker's lease keeper so that it renews them even when the worker's
--          event loop is blocked before it reads this reply (see renew.lua), and the
--          field '=', this call's nonce (a call run twice finds its first run's leases)
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
--   <host> <fingerprint length (2 digits)><fingerprint><payload>": age (ms) is how long ago
--   the request may have been seen and still be a duplicate (meta ha_recrawl_after; none:
--   the crawl's HA_DUPEFILTER_TTL, or for ever, lib/aged); parent is '-' (none), '+/' (a
--   page's link whose page is fenced in another shard: a duplicate counts as filtered) or
--   "<entry id>/<lease token>" of the page that yielded it; taken is '-' or "<entry id>/<lease
--   token>" made by the worker, which already handed the request to its engine: stored
--   LEASED to it under that id and token (not pending) and marked handed, its download
--   waiting for this reply; or "=<entry id>/<lease token>": the same, not marked handed (the
--   worker keeps the request in its buffer: a new request of a LIFO crawl, see _keep.py);
--   sent is '-' or "<worker nonce>.<n>": the worker numbers its children 1, 2, ... in the
--   order it sends them, so a request whose n is not above the number KEYS[19] holds for
--   that nonce was stored (or filtered, or refused) by an earlier call whose reply was lost,
--   and is skipped: a resent round enqueues and counts nothing twice; host is the host of
--   its URL ('-': none), its back queue's and its domain's for the limits and the counters;
--   length 00 = never filtered; e.g. "-3 - - 9f3a.17 books.example 12<12 bytes>{...}"
-- then ARGV[2] acks, one argument each: "<entry id> <lease token>", followed by what the
--   page commits with its ack, if anything: its items and its task's checkpoint (lib/commit;
--   a checkpoint names its keys by their index in KEYS, after KEYS[27] or KEYS[28])
-- then ARGV[9] leases to give back, one argument each: "<entry id> <lease token>" (a stale
--   token gives nothing back; see lib/release)
-- then the hosts the lease passes over, "<host>=<priority>" separated by spaces ('' none):
--   the worker's downloads of them are full and its buffer holds their next requests, up
--   to that priority (lib/frontier: frontier_open's skip; their queues stay ready for the
--   other workers)
-- then the gate number: the log's '=' as the worker last saw it (0: none), see the reply
-- then the dupefilter's spec: 'set', 'set <ttl ms>' or 'bloom ...' (lib/seen)
-- Priorities are clamped (lib/priority).
-- Returns {now_ms, added, acked, stale, pending, leased, delayed, refused, set_aside,
--          roots_seen, paused (1 or 0), n, d, head (the score of the best ready queue's
--          head, '' when none: the worker holds back a buffered request it outranks),
--          released (leases given back), items (added to the stream by accepted acks),
--          checkpoints (saved by them), gate number (the log's '=', 0: no log),
--          domain1, open_at1, ... (n gates closed now and changed after the number the
--            worker gave, and with open_at 0 those an operator opened since, gate_open.lua;
--            every closed gate when its number is 0 or above the log's: garbage, or a
--            server clock set back; a log lost goes on above it, gate.lua),
--          lists: one string, its fields separated by spaces (see the end of the script):
--            dropped_id1 ... (d taken requests not stored: duplicates, or refused)
--            id1 token1 expiries1 wait1 score1 ... (the leases),
--          payload1, ... (each lease's, in the same order)}
--   (refused: children whose parent's lease is no longer current: not enqueued, the
--   dupefilter untouched; set_aside: elements without an entry id, dead-lettered;
--   roots_seen: requests without a parent (start requests) the dupefilter had seen, so
--   that a worker joining a crawl can say how many of its start requests were not new
--   (counted as start_duplicates, apart from the links of pages, counted as filtered);
--   payload '' when the entry has no payload: the worker dead-letters it as corrupt;
--   expiries: how many of the entry's leases expired before, so the worker can run a
--   suspect alone and only the request that kills workers is counted as poison;
--   wait: ms before the request may start, for its domain's rate limit, lib/polite;
--   score: its pending score, so that the worker's buffer keeps Redis's order across calls).
-- With limits in force or gates closed, a back queue whose host may not go now waits
-- (counted as domain_limited when its host is at a limit) until it may: the lease reads at
-- most LOOK_FACTOR such queues per lease wanted, and none of their requests.
--- @include "time"
--- @include "types"
--- @include "lease"
--- @include "number"
--- @include "priority"
--- @include "counter"
--- @include "deadletter"
--- @include "stats"
--- @include "polite"
--- @include "frontier"
--- @include "release"
--- @include "held"
--- @include "commit"
--- @include "seen"
--- @include "batch"
-- LOOK_FACTOR: back queues parked (or elements set aside) at most per lease wanted in one
-- call: a crawl whose every host is at its limit costs a bounded call, the rest is looked
-- at by the next one. Waiting queues woken per call are bounded the same way.
local LOOK_FACTOR = 4
local now = now_ms()
local n_enq, n_ack, n_lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n_back = tonumber(ARGV[9])
local lease_ms, n_promote = tonumber(ARGV[4]), tonumber(ARGV[5])
local lifo, start_lifo, start_kept = order_flags(ARGV[7])
local nonce = ARGV[6]
local expect_id, expect_n = str_match(ARGV[8] or '', '^([%w]+)%.(%d+)$')
if not (n_enq and n_ack and n_lease and lease_ms and n_promote and n_back)
    or #ARGV ~= 12 + n_enq + n_ack + n_back
    or not str_match(nonce or '', '^[%w]+$') or lifo == nil
    or not (expect_id or ARGV[8] == '-') then
  return redis.error_reply('ERR sync: bad arguments (counts, nonce, order or expect)')
end
local paused = redis_call('EXISTS', KEYS[18])
if paused == 1 then n_lease = 0 end -- (ARGV[3], the leases asked: checked for even paused)

-- 1. read and check every request before any write: its fields by index (R_*), in a
-- positional table
-- (one table of the field indexes: a script's main function holds at most 200 locals)
local R = {PRIO = 1, PRIO_S = 2, START = 3, PID = 4, PTOK = 5, TID = 6, TTOK = 7, KEPT = 8,
  SID = 9, SN = 10, HOST = 11, FP = 12, PAYLOAD = 13, AGE = 14}
local reqs = {}
for i = 1, n_enq do
  local e = ARGV[9 + i]
  local prio, start, age, pid, ptok, tid, ttok, sid, sn, host, rest = str_match(e,
    '^(%-?%d+)(s?)@?(%d*) ([^ /]+)/?(%S*) ([^ /]+)/?(%S*) ([^ .]+)%.?(%d*) (%S+) ()')
  local d1, d2 = str_byte(e, rest or 1, (rest or 1) + 1)
  local fl = rest and d1 and d2 and d1 >= 48 and d1 <= 57 and d2 >= 48 and d2 <= 57
    and (d1 - 48) * 10 + d2 - 48
  if not (prio and fl and (pid == '-' or ptok ~= '' or pid == '+')
      and (tid == '-' or (ttok ~= '' and tid ~= '=' and tid ~= '=-'))
      and (sid == '-' or sn ~= ''))
      or #e < rest + 1 + fl then
    return redis.error_reply('ERR sync: malformed request argument ' .. i)
  end
  local p = tonumber(prio)
  if p > MAX_PRIORITY or p < -MAX_PRIORITY then
    p = clamp_priority(p)
    prio = int_str(p)
  end
  -- (no C call for a field that is absent: each costs the server about 600 instructions)
  local kept = tid ~= '-' and str_byte(tid) == 61 -- '=': a taken request kept, not handed out
  local linked = pid == '+' -- fenced in its page's shard: no parent here, yet no root
  reqs[i] = {p, prio, start == 's' and start_kept, pid ~= '-' and not linked and pid,
    linked and '+' or ptok,
    tid ~= '-' and (kept and str_sub(tid, 2) or tid), ttok, kept, sid ~= '-' and sid,
    sn ~= '' and tonumber(sn) or nil, host, str_sub(e, rest + 2, rest + 1 + fl),
    str_sub(e, rest + 2 + fl), age ~= '' and tonumber(age) or nil}
end

-- The keys this call may touch, known from its arguments, are checked (a key it cannot
-- touch is checked by the next call that may, before its first write): every call reads
-- leased, delayed, gates, ready, waiting and queued; one with something to do writes the
-- payloads, the leases and the stats; acks, leases and leases given back touch the rest.
-- The types read (TY[i], 'none': KEYS[i] does not exist) spare the reads of keys that do
-- not exist and that this script never makes (delayed, gates, limits, retried, expiries).
local err, TY
do
  local asked = tonumber(ARGV[3])
  local any, ack, lease = n_enq + n_ack + asked + n_back > 0, n_ack > 0, asked > 0
  -- (each a type, or nil when the call cannot touch the key)
  local any_h, ack_h, lease_h = any and 'hash' or nil, ack and 'hash' or nil,
    lease and 'hash' or nil
  err, TY = wrong_type('sync', KEYS, {nil, any_h, nil, nil, 'zset', any_h,
    (ack or lease) and 'hash' or nil, 'zset', lease_h, nil, 'hash', lease and 'zset' or nil,
    lease_h, any_h, any_h, any_h, ack_h, nil, (n_enq > 0 or expect_id) and 'hash' or nil,
    lease_h, (ack or lease or n_back > 0) and 'hash' or nil, 'zset', 'zset', 'string', lease_h,
    ack and 'stream' or nil, 'zset'})
end
if err then return err end
local acks
acks, err = commit_acks(KEYS, ARGV, 9 + n_enq, n_ack)
if err then return err end
local seen
if n_enq > 0 then
  seen, err = seen_open('sync', KEYS[3], ARGV[#ARGV], KEYS, now)
  if err then return err end
end
-- The grant, KEYS[28], is there when the caller names a worker: told apart by its name
-- (<crawl>:grant:<worker>) from the checkpoint keys an ack may add after the fixed keys.
local GRANT
do
  local crawl_base = str_sub(KEYS[1], 1, #KEYS[1] - #'q:')
  GRANT = KEYS[28] and str_sub(KEYS[28], 1, #crawl_base + 6) == crawl_base .. 'grant:'
    and KEYS[28] or nil
end
if expect_id then
  local have = tonumber(redis_call('HGET', KEYS[19], expect_id)) or 0
  if have < tonumber(expect_n) then
    return redis.error_reply(str_format('LOSTCHILDREN %s %s', int_str(have), expect_n))
  end
end
frontier_open(KEYS[1], KEYS[22], KEYS[23], KEYS[24], lifo, start_lifo, ARGV[#ARGV - 2])

-- The leases this call writes (taken requests and leased ones), in one command each.
local expiry = int_str(now + lease_ms)
local w_leased, w_records, w_payloads, w_grant = {}, {}, {}, {}
local write_lease = (n_enq > 0 or n_lease > 0) and function(id, tok, record, payload)
  local n = #w_leased
  w_leased[n + 1], w_leased[n + 2] = expiry, id
  w_records[n + 1], w_records[n + 2] = id, record
  w_payloads[n + 1], w_payloads[n + 2] = id, payload
  local g = #w_grant
  w_grant[g + 1], w_grant[g + 2] = id, tok
end

-- A taken request is stored leased to the worker that took it; the same argument sent again
-- (the reply to an earlier call was lost) finds its lease and changes nothing.
-- A request numbered by its worker (sent) and not above that worker's number in KEYS[19]
-- was handled by an earlier call whose reply was lost: it is not stored or counted again
-- (reported added; a taken one whose lease is gone, dropped).
-- (each step's function is made only when the call has that step to do: a closure made
-- by the main function looks up each of its upvalues in the list of those open, about
-- 10,000 instructions a function, a sixth of a call with nothing to do)
local added, refused, roots_seen = 0, 0, 0
local dropped, n_taken = {}, 0
-- (records: the acks' lease records, read first, by entry id (false: none), or nil: a
-- parent acked in the same call, as most are, is fenced with them, not an HGET of its own)
local enqueue_all = n_enq > 0 and function(records)
  local sent = {} -- worker nonce -> its number in KEYS[19] before this call
  local parents = {} -- entry id of a parent -> the token of its current lease (false: none)
  local base = take_ids(KEYS[4], n_enq)
  for i = 1, n_enq do
    local r = reqs[i]
    local sid, pid, tid = r[R.SID], r[R.PID], r[R.TID]
    if sid and not sent[sid] then sent[sid] = tonumber(redis_call('HGET', KEYS[19], sid)) or 0 end
    if pid and parents[pid] == nil then
      local v = records and records[pid]
      if v == nil then v = redis_call('HGET', KEYS[6], pid) end
      parents[pid] = v and lease_token(v) or false
    end
    if tid and lease_current(KEYS[6], tid, r[R.TTOK]) then
      added = added + 1 -- stored by an earlier call whose reply was lost: keep it granted
      n_taken = n_taken + 1
      local g = #w_grant
      w_grant[g + 1], w_grant[g + 2] = tid, r[R.TTOK]
    elseif sid and r[R.SN] <= sent[sid] then
      if tid then dropped[#dropped + 1] = tid else added = added + 1 end
    elseif pid and parents[pid] ~= r[R.PTOK] then
      refused = refused + 1
      if tid then dropped[#dropped + 1] = tid end
    elseif r[R.FP] == '' or seen_add(seen, r[R.FP], r[R.AGE]) then
      local host, start = r[R.HOST], r[R.START]
      if tid then
        -- marked handed: it is in the worker's engine already (its expiry counts to poison);
        -- a kept one is marked when the worker hands it out (renew.lua)
        local score = pending_score(r[R.PRIO], base + i, (start and start_lifo) or
          (not start and lifo), start)
        local record = lease_record(r[R.TTOK], int_str(score), host)
        if not r[R.KEPT] then record = lease_mark_handed(record) end
        write_lease(tid, r[R.TTOK], record, r[R.PAYLOAD])
        n_taken = n_taken + 1
      else
        frontier_push(queue_id(r[R.PRIO_S], start, host), r[R.PRIO], start, id_text(base + i),
          r[R.PAYLOAD])
      end
      added = added + 1
      count('enqueued', 1, host)
    else
      if tid then dropped[#dropped + 1] = tid end
      if pid or r[R.PTOK] == '+' then
        count('filtered', 1)
      else
        roots_seen = roots_seen + 1
        count('start_duplicates', 1)
      end
    end
  end
  local newest = {}
  for i = 1, n_enq do
    local sid, sn = reqs[i][R.SID], reqs[i][R.SN]
    if sid and sn > (newest[sid] or sent[sid]) then newest[sid] = sn end
  end
  for sid, n in pairs(newest) do redis_call('HSET', KEYS[19], sid, int_str(n)) end
  frontier_write()
  seen_close(seen)
end

-- 2. acks: a malformed ack or an unreadable lease record is refused as stale; an accepted
-- ack commits what its page yielded (lib/commit), a stale one commits nothing
-- (a function of its own, as promote_and_lease below: the main function's locals are few)
local acked, stale, committed, cps = 0, 0, 0, 0
-- (the acks' lease records are read first, and the enqueue, step 1, runs here with them:
-- nothing it does writes a lease record, and its parents are mostly pages acked here)
local ack_all = n_ack > 0 and function()
  local ids, ended, once = {}, {}, {}
  for i = 1, n_ack do ids[i] = acks[i].id or '' end
  local records = batched('HMGET', KEYS[6], ids, 1)
  if n_enq > 0 then
    local by_id = {}
    for i = 1, n_ack do by_id[ids[i]] = records[i] or false end
    enqueue_all(by_id)
  end
  for i = 1, n_ack do
    local v, id = records[i], ids[i]
    local token, domain = lease_parts(v)
    if token and token == acks[i].tok and not once[id] then
      once[id] = true
      ended[#ended + 1] = id
      local n_items, n_cp = commit_apply(KEYS[26], acks[i])
      committed, cps = committed + n_items, cps + n_cp
      count('acked', 1, domain)
    else
      stale = stale + 1
      commit_refuse(acks[i])
    end
  end
  acked = #ended
  if acked > 0 then
    batched('ZREM', KEYS[5], ended, 1)
    batched('HDEL', KEYS[6], ended, 1)
    batched('HDEL', KEYS[2], ended, 1)
    -- (expiries, retried and polite exist as they did when checked: nothing before makes them)
    if TY[7] ~= 'none' then batched('HDEL', KEYS[7], ended, 1) end
    if TY[17] ~= 'none' then
      count('retry_ok', batched('HDEL', KEYS[17], ended, 1))
    end
    if TY[21] ~= 'none' then
      polite_free(KEYS[21], ended)
      polite_woken(KEYS[21], frontier_wake_one) -- queues that waited for a slot freed here
    end
  end
end
if n_ack > 0 then ack_all() elseif n_enq > 0 then enqueue_all() end

local released = 0
-- A call run twice: the client sent it again after a connection error took its reply
-- (the Redis Cluster client resends a command by itself), so the worker reads this run's
-- reply only. The grant, written by the first run under this call's nonce (its field '='),
-- still names the leases the first run gave (their tokens start with the nonce): given
-- back here, at their place, the lease below gives them again, instead of leaving them to
-- wait out their lease unseen; so does a run that leases nothing, the crawl paused since
-- (the keys are checked as for a lease: see the type checks). (A grant that is not a hash
-- is left to the DEL below.)
if GRANT and tonumber(ARGV[3]) > 0 and redis.pcall('HGET', GRANT, '=') == nonce then
  local g, mark = redis_call('HGETALL', GRANT), nonce .. '-'
  for i = 1, #g, 2 do
    if str_sub(g[i + 1], 1, #mark) == mark
        and release_lease(KEYS[5], KEYS[6], KEYS[2], KEYS[21], g[i], g[i + 1]) then
      released = released + 1
    end
  end
end
for i = 1, n_back do
  local id, tok = str_match(ARGV[9 + n_enq + n_ack + i], '^(%S+) (%S+)$')
  if id and release_lease(KEYS[5], KEYS[6], KEYS[2], KEYS[21], id, tok) then
    released = released + 1
  end
end
if released > 0 and redis_call('EXISTS', KEYS[21]) == 1 then
  polite_woken(KEYS[21], frontier_wake_one) -- queues that waited for a slot freed here
end

local out = {now, added, acked, stale, 0, 0, 0, refused, 0, roots_seen, paused, 0, #dropped, '',
  released, committed, cps, 0}
-- The fields of the dropped ids and the leases, sent as one element (see the end)
local lists = {}
local n_given = 0
-- domain -> the time its gate opens (false: open), read for the hosts the lease meets
local closed = {}
if TY[27] ~= 'none' then -- the gates changed since the worker's number (gate.lua writes them)
  -- (a function: its locals are its own, the script's main function holds at most 200)
  local read_gates = function()
    local since = tonumber(ARGV[#ARGV - 1]) or 0
    local last = finite(redis_call('ZSCORE', KEYS[27], '='))
    out[18] = last and int_str(last) or 0
    if not last or since == last then return end
    local changes = since > 0 and since < last -- else every gate (0: a new worker)
    local from = changes and '(' .. int_str(since) or '-inf' -- above the log's: all
    local changed = redis_call('ZRANGEBYSCORE', KEYS[27], from, '+inf')
    local times = TY[11] ~= 'none' and batched('HMGET', KEYS[11], changed, 1) or {}
    for i, domain in ipairs(changed) do
      local open_at = finite(times[i]) -- garbage ('nan', 'inf' too) opens the gate
      open_at = open_at and open_at > now and math_ceil(open_at)
      -- '!<domain>': an operator opened its gate early (gate_open.lua): 0, so that a worker
      -- holding a copy opens it (one that reads every gate holds none); the log orders a
      -- later close of the domain after it, which the worker takes instead
      local opened = str_byte(domain) == 33 and changes and str_sub(domain, 2)
      if open_at and domain ~= '=' or opened then
        if open_at then closed[domain] = open_at end
        out[#out + 1] = opened or domain
        out[#out + 1] = open_at and int_str(open_at) or '0' -- whole, as the worker reads it
        out[12] = out[12] + 1 -- n, the number of gates returned
      end
    end
  end
  read_gates()
end
out[#out + 1] = '' -- the lists' element, written at the end
for _, id in ipairs(dropped) do lists[#lists + 1] = id end

-- 3. promote due delayed entries, then lease: a function of its own (a script's main
-- function holds at most 200 locals, the libraries' included)
local promote_and_lease = n_lease > 0 and function()
  -- (the delayed set, waiting set and limits: read when they exist; this call made none)
  local due = TY[8] ~= 'none'
    and redis_call('ZRANGEBYSCORE', KEYS[8], '-inf', int_str(now), 'LIMIT', '0', ARGV[5]) or {}
  if #due > 0 then
    local restores = batched('HMGET', KEYS[9], due, 1)
    local payloads = batched('HMGET', KEYS[2], due, 1)
    for i, id in ipairs(due) do
      local score, host = restore_parts(restores[i])
      local qid, place = queue_of(score, host or domain_of(payloads[i]))
      frontier_return(qid, id, place, payloads[i] or '')
    end
    batched('ZREM', KEYS[8], due, 1)
    -- a revisit promoted is dated now in the revisits set (lib/revisit: one more than a day
    -- past its due time is taken for gone): after a stop of days, each is counted, and
    -- holds its URL, while it waits in its back queue
    -- (the revisits set is named from KEYS[1], as the back queues are; not checked with
    -- the others: a crawl without revisits has none, and one that is not a sorted set is
    -- left alone, or the ZADD would fail the call half-way)
    local revisits = str_sub(KEYS[1], 1, #KEYS[1] - #'q:') .. 'revisits'
    if redis_call('TYPE', revisits)['ok'] == 'zset' then
      local dated, now_s = {}, int_str(now)
      for _, id in ipairs(due) do dated[#dated + 1] = now_s; dated[#dated + 1] = id end
      batched('ZADD', revisits, dated, 2, {'XX', 'GT'})
    end
    for _, id in ipairs(due) do held_clear(KEYS[25], id) end
    batched('HDEL', KEYS[9], due, 1)
    batched('HDEL', KEYS[2], due, 1)
  end
  local most = n_lease * LOOK_FACTOR + 16
  if TY[23] ~= 'none' then frontier_due(now, most) end
  local polite = TY[20] ~= 'none' and polite_open(KEYS[20], KEYS[21], now, lease_ms,
    TY[20] == 'hash')
  -- An element without an entry id cannot be leased, acked or renewed: set it aside.
  local function set_aside(e, host)
    local id = int_str(take(KEYS[4], 1) + 1)
    dead_letter(KEYS[12], KEYS[13], id, {class = 'corrupt',
      reason = 'corrupt queue entry: a pending request without an entry id'}, now)
    count('dead', 1, host, 'corrupt')
    redis_call('HSET', KEYS[2], id, e)
    out[9] = out[9] + 1
  end
  local function admit(host, id, qid)
    local open_at = closed[host]
    if open_at == nil and TY[11] ~= 'none' then -- (a gate's text is the crawl's data)
      local text = redis_call('HGET', KEYS[11], host)
      open_at = finite(text)
      open_at = open_at and open_at > now and math_ceil(open_at)
      if text and not open_at then redis_call('HDEL', KEYS[11], host) end -- expired, garbage
      closed[host] = open_at or false
    end
    if open_at then return nil, open_at end
    if not polite then return 0 end
    local wait, untl, slot = polite_admit(polite, id, host)
    if wait then return wait end
    count('domain_limited', 1)
    if slot then polite_wait(polite, host, qid) end
    return nil, untl
  end
  local tbase, given = nil, 0
  local function give(id, payload, score, score_s, host, came_back, wait)
    tbase = tbase or (nonce .. '-' .. int_str(take(KEYS[10], n_lease)) .. '.')
    given = given + 1
    local tok = tbase .. num_str(given)
    score_s = score_s or int_str(score) -- the reply's too: exact where a number is not
    write_lease(id, tok, lease_record(tok, score_s, host), payload)
    local expiries = '0' -- a string: a number would cost table.concat a sprintf
    if came_back and TY[7] ~= 'none' then
      expiries = select(2, expiry_counts(redis_call('HGET', KEYS[7], id)))
    end
    local o = #lists
    lists[o + 1], lists[o + 2], lists[o + 3], lists[o + 4], lists[o + 5] =
      id, tok, expiries, wait == 0 and '0' or wait, score_s
    out[#out + 1] = payload
  end
  local taken = frontier_take(n_lease, admit, give, set_aside, most)
  count('queues_gone', FP.GONE) -- entries of ready that named an empty queue, dropped
  return taken
end
if n_lease > 0 then n_given = promote_and_lease() end
if #w_leased > 0 then
  batched('ZADD', KEYS[5], w_leased, 2)
  batched('HSET', KEYS[6], w_records, 2)
  batched('HSET', KEYS[2], w_payloads, 2)
end
-- The grant: the pairs this call leases (taken requests included), for the lease keeper.
local grant = (n_lease > 0 or n_taken > 0) and GRANT or nil
if grant then
  redis_call('DEL', grant)
  if #w_grant > 0 then
    w_grant[#w_grant + 1], w_grant[#w_grant + 2] = '=', nonce -- the call (see above)
    batched('HSET', grant, w_grant, 2)
    redis_call('PEXPIRE', grant, ARGV[4])
  end
end
-- the keys kept wide (lib/types) by a call that may write them: ready, by every call with
-- something to do; a call with nothing to do writes none of them
if n_enq + n_ack + n_lease + n_back > 0 then keep_wide(KEYS[22], 'zset') end
polite_write(KEYS[21])
write_stats(KEYS[14], KEYS[15], KEYS[16], now)
frontier_close()
out[5] = frontier_pending(n_lease > 0 and n_given == 0, true)
out[6] = redis_call('ZCARD', KEYS[5])
if n_enq + n_ack + n_lease + n_back > 0 then
  keep_wide(KEYS[5], 'zset', out[6]) -- from 32 leases in flight (lib/types)
  keep_wide(KEYS[6], 'hash', out[6])
  keep_wide(KEYS[2], 'hash', out[6]) -- the payloads: a listpack too where they are short
end
out[7] = TY[8] ~= 'none' and redis_call('ZCARD', KEYS[8]) or 0
out[14] = frontier_head()

-- The reply as sent: the 18 numbers and the gates' pairs, one element each, then the
-- fields of the dropped ids and the leases in one element, separated by spaces (none holds
-- one: entry ids, tokens, whole numbers, scores; a score is an element's id text where the
-- id is its score, garbage in a corrupt element: the worker reads it as no place), then
-- each lease's payload, binary, an element of its own. One element per field cost the
-- worker's client a fifth more CPU per call at 10 leases (redis-py parses each element
-- apart; docs/benchmarks.md).
out[19 + 2 * out[12]] = table.concat(lists, ' ')
return out
