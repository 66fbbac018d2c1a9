#!lua name=proto3
-- A MINIMAL prototype of the sync round, third design (proto2 with the reclaim index kept
-- per lease call, and the lease's Lua on flat arrays) (issue 31 research; not wired into
-- scrapy-ha). One FCALL: enqueue children (fenced by their parent's lease, deduped), ack
-- leases (fenced by token), lease n in priority then FIFO order from per-host back queues.
--
-- Data (all keys share the crawl's hash tag):
--   seen    SET   fingerprints (the dupefilter)
--   leased  ZSET  "<token prefix> <n>" -> expiry ms: the reclaim's index, one member per
--                 lease call (its n leases share their expiry; a worker renews all it holds,
--                 so it renews the call's member: ZADD XX GT). An ack touches nothing here:
--                 reclaim drops a member whose tokens are all gone from held.
--   stale   SET   tokens reclaim took back (or given back): an ack's fallback, see step 1
--                 (written by reclaim, the rare path; kept an hour)
--   held    HASH  token -> the element leased ("<id><suffix> <host> <payload>"): a token
--                 is current iff its field exists (the fence), its value is what reclaim
--                 puts back in its queue. Tokens are unique (nonce + call seq + index), so
--                 a token names one lease of one entry: no id is needed to fence.
--   ready   ZSET  queue key -> the id of its head (fixed-width digits, an exact double)
--   stats   HASH  seq (the call sequence), pending (+ enqueued, acked with opt C)
--   queues  LIST  one per priority and host, named by the client (a key of the crawl's tag)
-- leased and ready hold a sentinel member (score 9e15, 70 bytes) so that Redis never keeps
-- them as a listpack (a listpack of 50 to 128 entries costs every write and lookup a scan).
-- An element: <3-digit priority code><9-digit call seq><3-digit index> <host> <payload>;
--   its first 15 chars are its id, which sorts it: code = 500 - priority, then FIFO. Element
--   texts compare as their ids do (fixed width, unique), so the lease compares them whole.
--
-- FCALL proto3_sync 5 seen leased held ready stats  n_enq n_ack n_lease lease_ms nonce opts
--   then n_ack  ack tokens
--   then n_enq  the parent: '-' (none), the index (3 digits, from 1) of its ack in this
--               call, or the token of a lease not acked here
--   then n_enq  fingerprints
--   then n_enq  queue keys (the client sorts the children by queue)
--   then n_enq  priority codes (3 digits)
--   then n_enq  "<3-digit index in the worker's order> <host> <payload>"
--   then, opt D: pairs "<domain>:<event>" "<count>" (per-domain tallies)
-- Returns {acked, added, refused, filtered, pending, token_prefix, e1, ..., ek}: lease j's
--   token is token_prefix .. <j, 3 digits>, its entry id the first 15 chars of e_j.

-- (a library's load sees no 'string', 'math' or 'unpack': read at the first call)
local SUF, ID_LEN, call, unpack, str_sub, str_find, tonumber, str_format, math_floor
local SENT_R, SENT_L, SENT_SCORE
local function init()
  call, unpack, str_sub, str_find, tonumber = redis.call, _G.unpack, _G.string.sub,
    _G.string.find, _G.tonumber
  str_format, math_floor = _G.string.format, _G.math.floor
  ID_LEN = 15
  SUF = {}
  for i = 0, 999 do SUF[i] = str_format('%03d', i) end
  SENT_R = 'sentinel:' .. _G.string.rep('-', 64)
  SENT_L = SENT_R
  SENT_SCORE = '9000000000000000'
end

local function sync(KEYS, ARGV)
  if not SUF then init() end
  local SEEN, LEASED, HELD, READY, STATS, STALE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
    KEYS[6]
  local n_enq, n_ack, n_lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local lease_ms, nonce, opts = tonumber(ARGV[4]), ARGV[5], ARGV[6]
  if not (n_enq and n_ack and n_lease and lease_ms) or n_enq > 999 or n_lease > 999 then
    return redis.error_reply('ERR proto3: bad counts')
  end
  local A_TOK = 6
  local C_PAR = A_TOK + n_ack
  local C_FP = C_PAR + n_enq
  local C_Q = C_FP + n_enq
  local C_CODE = C_Q + n_enq
  local C_PL = C_CODE + n_enq
  -- (opts D, L, P: the children's hosts, the acks' hosts, each child's old-format string)
  local C_CH = C_PL + n_enq
  local A_H = C_CH + n_enq
  local C_OLD = A_H + n_ack
  -- features added back one at a time, to measure each (see the report)
  local O = {}
  if opts ~= '' then
    for k in string.gmatch(opts, '%a') do O[k] = true end
  end
  if O.g then _G.collectgarbage('stop') end -- (an experiment: the GC's share)
  local call = call
  local LOG, nl = nil, 0
  if O.R then -- (an experiment: every command recorded, returned after the reply)
    LOG = {}
    call = function(...)
      local a = {...}
      nl = nl + 1; LOG[nl] = tostring(#a)
      for i = 1, #a do nl = nl + 1; LOG[nl] = tostring(a[i]) end
      return redis.call(...)
    end
  end
  if O.T then -- type checks: every key the call may touch
    for i = 1, 6 do call('TYPE', KEYS[i]) end
  end
  if O.G then -- paused and gates: one EXISTS of both (0: neither, the common case)
    call('EXISTS', KEYS[1] .. ':paused', KEYS[1] .. ':gates')
  end
  if O.S then -- the worker's children numbered: the number this server holds
    call('HGET', STATS .. ':sent', nonce)
  end
  if O.P then -- today's one string per request, read with one pattern of 11 captures
    for i = 1, n_enq do
      local prio, start, age, pid, ptok, tid, ttok, sid, sn, host, rest = string.match(
        ARGV[C_OLD + i], '^(%-?%d+)(s?)@?(%d*) ([^ /]+)/?(%S*) ([^ /]+)/?(%S*) ([^ .]+)%.?(%d*) (%S+) ()')
      if not rest then return redis.error_reply('ERR proto3: old format ' .. i) end
    end
  end

  local seq_s = str_format('%09d', call('HINCRBY', STATS, 'seq', 1))
  local delta, added, refused, filtered, acked = 0, 0, 0, 0, 0

  -- 1. acks: a current token's field deleted (HDEL counts them). When all are counted
  -- (the common case) every ack was current; else the tokens reclaim took back (stale)
  -- tell which were not (one counted none of the two: an ack sent twice, its page's
  -- children dedupe)
  local ack_ok -- nil: every ack was current; else ack_ok[i]
  if n_ack > 0 then
    acked = call('HDEL', HELD, unpack(ARGV, A_TOK + 1, A_TOK + n_ack))
    if acked < n_ack then
      ack_ok = {}
      local st = call('SMISMEMBER', STALE, unpack(ARGV, A_TOK + 1, A_TOK + n_ack))
      for i = 1, n_ack do ack_ok[i] = st[i] == 0 end
    end
  end

  -- 2. enqueue: children fenced by their parent's lease (acked current in this call, or
  -- still held), deduped (SMISMEMBER, then SADD), pushed with one RPUSH per queue
  local keep = {}
  if n_enq > 0 then
    local n_keep = 0
    local ext, n_ext = nil, 0 -- parents not acked here: looked up in held
    for i = 1, n_enq do
      local p = ARGV[C_PAR + i]
      if p == '-' then
        keep[i] = true
      elseif #p == 3 then -- its parent is this call's ack of that index (3 digits)
        if not ack_ok then
          keep[i] = true
        elseif ack_ok[tonumber(p)] then
          keep[i] = true
        else
          refused = refused + 1
          keep[i] = false
        end
      else -- a token (longer than 3 characters) of a lease not acked here
        ext = ext or {}
        n_ext = n_ext + 1
        ext[n_ext] = i
      end
    end
    if n_ext > 0 then
      local toks = {}
      for k = 1, n_ext do toks[k] = ARGV[C_PAR + ext[k]] end
      local sc = call('HMGET', HELD, unpack(toks))
      for k = 1, n_ext do
        if sc[k] then keep[ext[k]] = true else keep[ext[k]] = false; refused = refused + 1 end
      end
    end
    local member = call('SMISMEMBER', SEEN, unpack(ARGV, C_FP + 1, C_FP + n_enq))
    local fps, simple = {}, refused == 0
    for i = 1, n_enq do
      if keep[i] then
        if member[i] == 1 then
          keep[i] = false
          filtered = filtered + 1
          simple = false
        else
          n_keep = n_keep + 1
          fps[n_keep] = ARGV[C_FP + i]
        end
      end
    end
    if n_keep > 0 then
      local n_new = call('SADD', SEEN, unpack(fps))
      if n_new < n_keep then
        -- (rare: one fingerprint twice in the call) the first goes, the others are filtered
        local once = {}
        n_keep = 0
        for i = 1, n_enq do
          if keep[i] then
            local fp = ARGV[C_FP + i]
            if once[fp] then keep[i] = false; filtered = filtered + 1
            else once[fp] = true; n_keep = n_keep + 1 end
          end
        end
      end
    end
    added = n_keep
    -- the elements, and one RPUSH per run of one queue
    local el, ne = {}, 0
    local newq, nn = nil, 0
    local run_start, qkey = 1, nil
    for i = 1, n_enq + 1 do
      local k = i <= n_enq and ARGV[C_Q + i] or nil
      if k ~= qkey then
        if qkey and ne >= run_start then
          local len = call('RPUSH', qkey, unpack(el, run_start, ne))
          if len == ne - run_start + 1 then -- the queue was empty: ready, by its head's id
            newq = newq or {SENT_SCORE, SENT_R}
            newq[nn + 3] = str_sub(el[run_start], 1, ID_LEN)
            newq[nn + 4] = qkey
            nn = nn + 2
          end
        end
        qkey, run_start = k, ne + 1
      end
      if k and keep[i] then
        ne = ne + 1
        el[ne] = ARGV[C_CODE + i] .. seq_s .. ARGV[C_PL + i]
      end
    end
    if newq then call('ZADD', READY, unpack(newq)) end
    delta = delta + added
  end

  -- 3. lease: the n best ready queues are the candidates (only they can hold the n best
  -- heads); their heads merged in id order
  local out = {0, 0, 0, 0, 0, ''}
  local given = 0
  if n_lease > 0 then
    local t = call('TIME')
    local expiry = str_format('%d', t[1] * 1000 + math_floor(t[2] / 1000) + lease_ms)
    local tokp = nonce .. seq_s .. '.'
    out[6] = tokp
    if O.Y then -- delayed retries: promote those due (none here: the read only)
      call('ZRANGEBYSCORE', KEYS[1] .. ':delayed', '-inf', t[1] .. '000', 'LIMIT', 0, 16)
    end
    if O.L then -- the limits of the candidates' hosts read (one HMGET)
      local c0 = call('ZRANGE', READY, 0, n_lease - 1)
      call('HMGET', STATS .. ':polite', unpack(c0))
    end
    local h, nh, done_opt = {}, 0, false
    if O.O then
      -- (opt O) optimistic: the head of each of the n best queues popped (LPOP) and the
      -- next one read (LINDEX): when every next is behind the last head popped, the n heads
      -- are the n best requests (the common case over many hosts); else they go back
      -- (LPUSH) and the exact merge below runs. (A crawl of fewer hosts than n: the exact
      -- merge.)
      local cz = call('ZRANGE', READY, 0, n_lease - 1)
      local nq = #cz
      if nq == n_lease and cz[nq] ~= SENT_R then
        local hd, nx, ok = {}, {}, true
        for i = 1, nq do
          hd[i] = call('LPOP', cz[i])
          nx[i] = call('LINDEX', cz[i], 0)
        end
        local top = hd[nq]
        for i = 1, nq do
          if not hd[i] or (nx[i] and nx[i] < top) then ok = false break end
        end
        if ok then
          local rz, nr, gone = {}, 0, nil
          for i = 1, nq do
            given = given + 1
            local tok = tokp .. SUF[given]
            h[nh + 1], h[nh + 2] = tok, hd[i]
            nh = nh + 2
            out[6 + given] = hd[i]
            local nxt = nx[i]
            if nxt then
              rz[nr + 1], rz[nr + 2] = str_sub(nxt, 1, ID_LEN), cz[i]
              nr = nr + 2
            else
              gone = gone or {}
              gone[#gone + 1] = cz[i]
            end
          end
          if nr > 0 then call('ZADD', READY, unpack(rz)) end
          if gone then call('ZREM', READY, unpack(gone)) end
          done_opt = true
        else
          for i = 1, nq do if hd[i] then call('LPUSH', cz[i], hd[i]) end end
        end
      end
    end
    local cands = done_opt and {} or call('ZRANGE', READY, 0, n_lease - 1)
    -- the candidates on flat arrays: key, elements read (buf), next index in buf, list index
    -- of buf[1], more to read; ord: the candidates by their head, best first
    local K, B, P, BASE, MORE, ord, nc = {}, {}, {}, {}, {}, {}, 0
    for i = 1, #cands do
      local key = cands[i]
      if key ~= SENT_R then
        local buf = call('LRANGE', key, 0, 1)
        if buf[1] then
          nc = nc + 1
          K[nc], B[nc], P[nc], BASE[nc], MORE[nc], ord[nc] = key, buf, 1, 0, buf[2] ~= nil, nc
        end
      end
    end
    -- (ready's order is the heads' order: ord is sorted already; ord[f..no] is the sorted
    -- run of the candidates left, best first)
    local f, last = 1, nc
    while given < n_lease and f <= last do
      local c = ord[f]
      local buf, p = B[c], P[c]
      local e = buf[p]
      given = given + 1
      local tok = tokp .. SUF[given]
      h[nh + 1], h[nh + 2] = tok, e
      nh = nh + 2
      out[6 + given] = e
      p = p + 1
      P[c] = p
      local nxt = buf[p]
      if not nxt and MORE[c] then -- read further
        BASE[c] = BASE[c] + #buf
        buf = call('LRANGE', K[c], BASE[c], BASE[c] + 3)
        B[c], P[c], MORE[c] = buf, 1, buf[4] ~= nil
        nxt = buf[1]
      end
      if not nxt then
        f = f + 1
      elseif f < last then
        local d = ord[f + 1]
        if B[d][P[d]] < nxt then
          -- it goes behind: at the end of the run (the common case, FIFO over many hosts:
          -- no move), else at its place found by bisection, the ones before it moved up
          local m = ord[last]
          if B[m][P[m]] < nxt then
            last = last + 1
            ord[last] = c
            f = f + 1
          else
            local lo, hi = f + 1, last
            while lo < hi do
              local mid = math_floor((lo + hi) / 2)
              local q = ord[mid]
              if B[q][P[q]] < nxt then lo = mid + 1 else hi = mid end
            end
            for j = f, lo - 2 do ord[j] = ord[j + 1] end
            ord[lo - 1] = c
          end
        end
      end
      -- (a queue emptied before n: a further candidate from ready is not read here; the
      -- next call finds it; enough for the benchmark, where queues do not run empty)
    end
    if given > 0 then
      local rz, nr, gone = {}, 0, nil
      for c = 1, nc do
        local taken = BASE[c] + P[c] - 1
        if taken > 0 then
          local nxt = B[c][P[c]]
          if not nxt then
            call('DEL', K[c])
            gone = gone or {}
            gone[#gone + 1] = K[c]
          else
            call('LTRIM', K[c], taken, -1)
            rz[nr + 1] = str_sub(nxt, 1, ID_LEN)
            rz[nr + 2] = K[c]
            nr = nr + 2
          end
        end
      end
      if nr > 0 then call('ZADD', READY, unpack(rz)) end
      if gone then call('ZREM', READY, unpack(gone)) end
      call('ZADD', LEASED, SENT_SCORE, SENT_L, expiry, tokp .. ' ' .. SUF[given])
      call('HSET', HELD, unpack(h))
      delta = delta - given
    end
  end

  -- 4. counters: the crawl's pending count (opt C: enqueued and acked too)
  local pending = -1
  if delta ~= 0 then pending = call('HINCRBY', STATS, 'pending', delta) end
  if O.C then
    if added > 0 then call('HINCRBY', STATS, 'enqueued', added) end
    if acked > 0 then call('HINCRBY', STATS, 'acked', acked) end
    if filtered > 0 then call('HINCRBY', STATS, 'filtered', filtered) end
    if refused > 0 then call('HINCRBY', STATS, 'refused', refused) end
  end
  if O.D then -- per-domain tallies, counted here from the hosts: enqueued and acked
    local t, fields = {}, {}
    for i = 1, n_enq do
      local f = ARGV[C_CH + i] .. ':enqueued'
      if not t[f] then t[f] = 0; fields[#fields + 1] = f end
      t[f] = t[f] + 1
    end
    for i = 1, n_ack do
      if not ack_ok or ack_ok[i] then
        local f = ARGV[A_H + i] .. ':acked'
        if not t[f] then t[f] = 0; fields[#fields + 1] = f end
        t[f] = t[f] + 1
      end
    end
    local key = STATS .. ':domain'
    for _, f in ipairs(fields) do call('HINCRBY', key, f, t[f]) end
  end
  if O.d then -- per-domain tallies as one log entry a call ("e <hosts...> a <hosts...>"),
    -- folded into stats:domain by the reader (status, metrics) in its own calls
    local parts, np = {'e'}, 1
    for i = 1, n_enq do if keep[i] ~= false then np = np + 1; parts[np] = ARGV[C_CH + i] end end
    np = np + 1; parts[np] = 'a'
    for i = 1, n_ack do
      if not ack_ok or ack_ok[i] then np = np + 1; parts[np] = ARGV[A_H + i] end
    end
    call('RPUSH', STATS .. ':domainlog', table.concat(parts, ' '))
  end
  if O.M then -- per-minute counters
    local key = STATS .. ':min'
    if added > 0 then call('HINCRBY', key, 'enqueued', added) end
    if acked > 0 then call('HINCRBY', key, 'acked', acked) end
  end
  if O.W then -- the grant: the lease keeper renews this call's leases even if the worker
    -- is blocked (one member names them all)
    if given > 0 then call('SET', STATS .. ':grant:' .. nonce, out[6] .. ' ' .. SUF[given], 'PX', lease_ms) end
  end
  if O.S and n_enq > 0 then call('HSET', STATS .. ':sent', nonce, seq_s) end
  if O.H then -- the reply's leased count and the best ready head
    call('ZCARD', LEASED)
    call('ZRANGE', READY, 0, 0, 'WITHSCORES')
  end
  if O.E and n_ack > 0 then -- an ack clears its entry's expiry count and retry mark
    call('HDEL', STATS .. ':expiries', unpack(ARGV, A_TOK + 1, A_TOK + n_ack))
    call('HDEL', STATS .. ':retried', unpack(ARGV, A_TOK + 1, A_TOK + n_ack))
  end
  if O.L then -- per-domain concurrency: +1 a lease, -1 an ack, per host (HINCRBY each)
    local key = STATS .. ':polite'
    local d = {}
    for j = 1, given do
      local e = out[6 + j]
      local host = str_sub(e, 17, (str_find(e, ' ', 17, true)) - 1)
      d[host] = (d[host] or 0) + 1
    end
    for i = 1, n_ack do
      local host = ARGV[A_H + i]
      d[host] = (d[host] or 0) - 1
    end
    for host, v in pairs(d) do if v ~= 0 then call('HINCRBY', key, host, v) end end
  end
  out[1], out[2], out[3], out[4], out[5] = acked, added, refused, filtered, pending
  if LOG then
    out[#out + 1] = '#LOG'
    for i = 1, nl do out[#out + 1] = LOG[i] end
  end
  return out
end

local function empty(KEYS, ARGV) return 0 end

-- reclaim: FCALL proto3_reclaim 6 <the sync's keys>  now_ms most
-- The lease calls whose expiry passed: each of their tokens still held goes back to the
-- head of its queue (its place: its id is older than what the queue holds, in a FIFO
-- crawl; a real reclaim puts it at its place, as lib/frontier's frontier_return), its token
-- into stale, and the call's member goes. Returns the number of requests put back.
local function reclaim(KEYS, ARGV)
  if not SUF then init() end
  local LEASED, HELD, READY, STATS, STALE = KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
  local due = call('ZRANGEBYSCORE', LEASED, '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
  local back = 0
  for _, m in ipairs(due) do
    local tokp, n = string.match(m, '^(%S+) (%d+)$')
    local toks = {}
    for j = 1, tonumber(n) do toks[j] = tokp .. SUF[j] end
    local els = call('HMGET', HELD, unpack(toks))
    local lost = {}
    for j = #toks, 1, -1 do -- the last first: each goes to its queue's head
      local e = els[j]
      if e then
        local host = string.match(e, '^%d+ (%S+) ')
        local key = string.sub(KEYS[1], 1, #KEYS[1] - #'seen') .. 'q:' .. string.sub(e, 1, 3)
          .. ':' .. host
        call('LPUSH', key, e)
        call('ZADD', READY, 'LT', string.sub(e, 1, ID_LEN), key)
        lost[#lost + 1] = toks[j]
        back = back + 1
      end
    end
    if #lost > 0 then
      call('HDEL', HELD, unpack(lost))
      call('SADD', STALE, unpack(lost))
      call('PEXPIRE', STALE, 3600000)
    end
    call('ZREM', LEASED, m)
  end
  if back > 0 then call('HINCRBY', STATS, 'pending', back) end
  return back
end
redis.register_function('proto3_reclaim', reclaim)

-- replay: FCALL proto3_replay 0 <k> <command and its k-1 arguments> ...: the commands a
-- call of proto3_sync ran (its opt R), run again with no other work: what they cost alone
redis.register_function('proto3_replay', function(KEYS, ARGV)
  if not SUF then init() end
  local i, n = 1, #ARGV
  while i <= n do
    local k = tonumber(ARGV[i])
    call(unpack(ARGV, i + 1, i + k))
    i = i + k + 1
  end
  return 0
end)
-- the same loop with a Lua stub for redis.call: the replay's own Lua
redis.register_function('proto3_replay_stub', function(KEYS, ARGV)
  if not SUF then init() end
  local stub = function() return 0 end
  local i, n = 1, #ARGV
  while i <= n do
    local k = tonumber(ARGV[i])
    stub(unpack(ARGV, i + 1, i + k))
    i = i + k + 1
  end
  return 0
end)

redis.register_function('proto3_sync', sync)
redis.register_function('proto3_empty', empty)
