--- @include "number"
--- @include "priority"
--- @include "heap"
--- @include "batch"
--- @include "types"
-- lib/frontier: the pending requests, one back queue per host and priority (Mercator's
-- back queues), a heap of the queues that may be leased now ordered by their head's place,
-- and a set of the queues that wait (their host behind a closed gate or at its limits).
--   back queue: a list at '<queues><qid>', <queues> being the caller's KEYS[i]
--       ('<prefix>:{<tag>}:q:') and qid '<priority>:<host>', or '<priority>s:<host>' for
--       start requests kept in their own queue. The script builds the name from that key,
--       so it carries the crawl's hash tag: Redis Cluster hashes the first {...} of a name
--       only, so every back queue is in the slot of the call's KEYS.
--   element: '<id> <payload>' for a request as enqueued (its id is its sequence number and
--       its place within its priority follows from it, lib/priority), or
--       '<id>@<place> <payload>' for one that came back (reclaimed, released, promoted,
--       requeued, converted from the old form), which keeps the place it had
--   ready: sorted set qid -> the score of its head element (lib/priority)
--   waiting: sorted set qid -> server time (ms) it is looked at again
--   queued: string, the number of requests in the back queues
-- Rule: a back queue that holds requests is in ready or in waiting, never both; a queue's
-- elements are in their order (a request that comes back goes to its place among the first
-- FP.RETURN_SCAN of its queue, behind them if its place is further); ready scores each queue
-- by its head. So the lease reads the heads of the best ready queues only, in Scrapy's
-- order, and never a request of a queue that waits.

-- FP.RETURN_SCAN: elements of a back queue read to put a request that comes back in its place:
-- a retry or a reclaimed lease goes back near the head of its queue (in FIFO order, at the
-- head), where a short read finds its place; one that belongs further (an old request in a
-- LIFO queue) goes right behind them, a bounded cost instead of a read of the whole queue.
-- (the private names of this file are fields of one table, FP: a script's main function
-- holds at most 200 locals, the libraries' included)
local FP = {}
FP.RETURN_SCAN = 32
-- FP.FIRST_READ: elements read of a ready queue when the lease first looks at it: its head and
-- the next (whose place is the queue's new score); later reads double, up to FP.MOST_READ.
FP.FIRST_READ = 2
FP.MOST_READ = 64
-- FP.MOST_GONE: entries of ready naming a back queue that holds nothing, dropped at most in
-- one call (FP.GONE: those dropped by this call, counted by the caller as queues_gone);
-- about 6 us of Redis each, so garbage left by a flush or an eviction costs a call 1.5 ms
-- at most, and the next calls drop the rest, whatever its size.
FP.MOST_GONE = 256
FP.GONE = 0

-- The keys and the order of this call (frontier_open), and the requests it added to (+) or
-- took from (-) the back queues, written once by frontier_close.
local F = {}
FP.DELTA = 0
-- Requests to push, by queue (frontier_push), and the queues in their first push's order.
FP.PUSHES, FP.PUSHED = {}, {}
-- FP.SKIP: host -> the priority up to which this call's lease passes over its queues
-- (frontier_open's skip: the caller's downloads of the host are full); FP.N_SKIP: how many.
-- FP.MOST_PASSED: the most ready entries passed over in one call (FP.PASSED: those so far),
-- and the most frontier_head reads: a skipped host of many priorities costs a bounded call.
FP.SKIP, FP.N_SKIP, FP.PASSED, FP.MOST_PASSED = {}, 0, 0, 256

-- order_flags(arg)
--   Reads a crawl's order argument, 'fifo' or 'lifo', then optionally ' fifo' or ' lifo'
--   (the order of its start requests kept in their own queue). Returns lifo, start_lifo,
--   kept (true when start requests have their own queue), or nil when it cannot be read.
local function order_flags(arg)
  local order, start = str_match(arg or '', '^(%a+) ?(%a*)$')
  if not (order == 'fifo' or order == 'lifo') or not (start == '' or start == 'fifo'
      or start == 'lifo') then
    return nil
  end
  return order == 'lifo', start == 'lifo', start ~= ''
end

-- frontier_open(queues, ready, waiting, queued, lifo, start_lifo, skip)
--   KEYS: queues (the prefix of the back queues' names), ready, waiting, queued (the
--   caller's KEYS[i]); lifo and start_lifo: the crawl's order within a priority and that of
--   its start queue (the places of enqueued elements follow from them); skip (optional):
--   "<host>=<priority>" separated by spaces: frontier_take passes over the host's queues of
--   that priority and below, and frontier_head does not name them (the caller's downloads
--   of the host are full, and it holds requests of the host of that priority). Call it first.
--   Rule (a host the caller cannot download now holds nothing back): a skipped queue stays
--   ready, untouched (its place, its score, its requests), for other callers and later calls;
--   it is not parked, which would hold it back from every worker. Rule (Scrapy's priority
--   order): a queue of a higher priority than the caller holds of the host is not skipped.
local function frontier_open(queues, ready, waiting, queued, lifo, start_lifo, skip)
  F = {queues = queues, ready = ready, waiting = waiting, queued = queued, lifo = lifo,
    start_lifo = start_lifo}
  for host, top in string.gmatch(skip or '', '(%S+)=(%-?%d+)') do
    if not FP.SKIP[host] then FP.N_SKIP = FP.N_SKIP + 1 end
    FP.SKIP[host] = tonumber(top)
  end
end

-- FP.skipped(prio, host)
--   Whether the queue of host at priority prio is passed over (frontier_open's skip).
function FP.skipped(prio, host)
  local top = FP.SKIP[host]
  return top ~= nil and (prio or 0) <= top
end

-- queue_id(prio, start, host)
--   Returns the qid of the back queue of host at (clamped) priority prio (a number, or its
--   text), start: a start request kept in its own queue.
local function queue_id(prio, start, host)
  if type(prio) == 'number' then prio = int_str(prio) end
  return prio .. (start and 's:' or ':') .. host
end

-- FP.queue_parts(qid)
--   Returns prio, start, host of a qid (prio nil when the qid cannot be read).
function FP.queue_parts(qid)
  local prio, s, host = str_match(qid, '^(%-?%d+)(s?):(.+)$')
  return tonumber(prio), s == 's', host
end

-- queue_of(score, host)
--   Returns the qid of the back queue a request of this pending score goes back to, and its
--   place within its priority.
local function queue_of(score, host)
  local prio, place, start = score_parts(score)
  return queue_id(prio, start, host), place
end

-- FP.queue_call(command, key, ...)
--   Runs a command on a back queue and returns its reply. A key that holds something else
--   than a list (garbage written by hand) is renamed aside first (lib/types), so the call
--   goes on instead of failing half-way.
function FP.queue_call(command, key, ...)
  local reply = redis_pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if not str_find(reply.err, 'WRONGTYPE', 1, true) then error(reply) end
    redis_call('RENAME', key, aside_name(key))
    return redis_call(command, key, ...)
  end
  return reply
end

-- FP.element_head(e)
--   Returns id, place, payload_at of a back queue's element: place nil for a request as
--   enqueued (its place follows from its id), payload_at the index its payload starts at;
--   id '' when the element has no id (corrupt: it cannot be leased), or an id that is not
--   a whole number where its place follows from it (enqueued ids are: any other text, 'abc'
--   or 'nan', would give a score that no ZADD takes, the call failing half-way).
function FP.element_head(e)
  -- an id of digits first, as every element the script writes has: one match, where the
  -- general pattern needs a str_find of the id too (a C call, about 1,000 server
  -- instructions; the lease reads two elements a request); what it does not read is read
  -- again by the general one, which then returns what it always did
  local id, place, at = str_match(e, '^(%d+)@?(%d*) ()')
  if id then
    if place == '' then return id, nil, at end
    return id, tonumber(place), at
  end
  id, place, at = str_match(e, '^([^ @]*)@?(%d*) ()')
  if not id then return '', nil, 1 end
  if place == '' then -- as enqueued: no place written
    if str_find(id, '%D') then return '', nil, at end
    return id, nil, at
  end
  return id, tonumber(place), at
end

-- valid_id(id)
--   Returns true when id can name an entry in an element: not empty, without a space (the
--   first space ends the id) or an '@' (it starts a written place).
local function valid_id(id)
  return id ~= '' and not str_find(id, '[ @]')
end

-- FP.element_score(prio, start, id, place)
--   Returns the pending score of an element of the back queue (prio, start) (lib/priority).
function FP.element_score(prio, start, id, place)
  if place then return score_of(prio, place) end
  local lifo = (start and F.start_lifo) or (not start and F.lifo)
  return pending_score(prio, tonumber(id) or 0, lifo, start)
end

-- FP.ready_add(pairs, opt)
--   Writes score, qid pairs to ready (opt: 'XX' 'LT' to only move queues there forward);
--   a score is text (int_str: a Lua number passed to Redis keeps 14 digits only).
function FP.ready_add(pairs, opt)
  if #pairs > 0 then batched('ZADD', F.ready, pairs, 2, opt and {'XX', 'LT'}) end
end

-- FP.pushes_of(qid, prio, start, lifo)
--   Returns the table of the requests to push to back queue qid (created empty, with its
--   priority, start flag and push order).
function FP.pushes_of(qid, prio, start, lifo)
  local t = FP.PUSHES[qid]
  if not t then
    t = {n = 0, prio = prio, start = start, lifo = lifo}
    FP.PUSHES[qid] = t
    FP.PUSHED[#FP.PUSHED + 1] = qid
  end
  return t
end

-- frontier_push(qid, prio, start, id, payload)
--   Adds a new request (id: its sequence number) to the end of its back queue qid (of
--   priority prio, a start queue if start) in the crawl's order (the tail for fifo, the head
--   for lifo). Written by frontier_write, in one command per queue.
local function frontier_push(qid, prio, start, id, payload)
  local t = FP.pushes_of(qid, prio, start, (start and F.start_lifo) or (not start and F.lifo))
  local n = t.n + 1
  t.n, t[n] = n, id .. ' ' .. payload
end

-- queue_empty(qid)
--   Returns true when the back queue qid holds no request.
local function queue_empty(qid)
  return FP.queue_call('LLEN', F.queues .. qid) == 0
end

-- frontier_append(qid, id, place, payload)
--   Adds a request that keeps its place (as frontier_return) at the tail of its back queue,
--   for a caller that adds a queue's requests in their order to a queue that was empty
--   (queue_empty): written by frontier_write, in one command per queue.
local function frontier_append(qid, id, place, payload)
  local prio, start = FP.queue_parts(qid)
  local t = FP.pushes_of(qid, prio, start, false)
  local n = t.n + 1
  t.n, t[n] = n, id .. '@' .. int_str(place) .. ' ' .. payload
end

-- frontier_write()
--   Writes the pushes of frontier_push and frontier_append: a queue that was empty joins
--   ready with its head's score; a lifo queue that got a new head moves forward in ready
--   (if it is there).
local function frontier_write()
  local new, moved = {}, {}
  for _, qid in ipairs(FP.PUSHED) do
    local t, key = FP.PUSHES[qid], F.queues .. qid
    local n, lifo = t.n, t.lifo
    local len = 0
    for i = 1, n, BATCH_ARGS do
      len = FP.queue_call(lifo and 'LPUSH' or 'RPUSH', key, unpack(t, i, math_min(n, i + BATCH_ARGS - 1)))
    end
    local into = (len == n and new) or (lifo and moved) or nil
    if into then -- the queue was empty, or has a new head
      local score = FP.element_score(t.prio, t.start, FP.element_head(lifo and t[n] or t[1]))
      into[#into + 1] = int_str(score)
      into[#into + 1] = qid
    end
    FP.DELTA = FP.DELTA + n
  end
  FP.ready_add(new)
  FP.ready_add(moved, true)
  FP.PUSHES, FP.PUSHED = {}, {}
end

-- frontier_return(qid, id, place, payload)
--   Puts a request that comes back (id, its place within its priority) into its back
--   queue at its place among the first FP.RETURN_SCAN elements, or at the tail when its place
--   is there, else right behind them; and the queue in ready when it was empty (or
--   forward, at its new head).
local function frontier_return(qid, id, place, payload)
  local key = F.queues .. qid
  local prio, start = FP.queue_parts(qid)
  local e = id .. '@' .. int_str(place) .. ' ' .. payload
  local head = FP.queue_call('LRANGE', key, '0', num_str(FP.RETURN_SCAN - 1))
  local at
  for i = 1, #head do
    if FP.element_score(prio, start, FP.element_head(head[i])) > score_of(prio, place) then
      at = i
      break
    end
  end
  FP.DELTA = FP.DELTA + 1
  if #head == 0 then
    FP.queue_call('RPUSH', key, e)
    FP.ready_add({int_str(score_of(prio, place)), qid})
  elseif at == 1 then
    FP.queue_call('LPUSH', key, e)
    FP.ready_add({int_str(score_of(prio, place)), qid}, true)
  elseif at then
    FP.queue_call('LINSERT', key, 'BEFORE', head[at], e)
  elseif #head < FP.RETURN_SCAN or FP.element_score(prio, start,
      FP.element_head(FP.queue_call('LINDEX', key, '-1'))) <= score_of(prio, place) then
    FP.queue_call('RPUSH', key, e) -- its place is the tail (a requeued request, in fifo order)
  else
    FP.queue_call('LINSERT', key, 'AFTER', head[#head], e)
  end
end

-- frontier_park(qid, untl)
--   Moves a ready queue to waiting until server time untl (ms).
local function frontier_park(qid, untl)
  redis_call('ZREM', F.ready, qid)
  redis_call('ZADD', F.waiting, int_str(untl), qid)
end

-- frontier_wake_one(qid, back)
--   Moves the queue qid back to ready, scored by its head, if it waits; returns true when it
--   did (false: it did not wait, or holds nothing any more and is forgotten). With back (a
--   table), its score, qid pair is added there for the caller's ZADD instead.
local function frontier_wake_one(qid, back)
  if redis_call('ZREM', F.waiting, qid) == 0 then return false end
  local e = FP.queue_call('LINDEX', F.queues .. qid, '0')
  local prio, start = FP.queue_parts(qid)
  if not (e and prio) then return false end
  local pair = back or {}
  pair[#pair + 1] = int_str(FP.element_score(prio, start, FP.element_head(e)))
  pair[#pair + 1] = qid
  if not back then FP.ready_add(pair) end
  return true
end

-- FP.wake(qids)
--   Moves the queues of qids that are waiting back to ready (frontier_wake_one), in one ZADD.
function FP.wake(qids)
  local back = {}
  for _, qid in ipairs(qids) do frontier_wake_one(qid, back) end
  FP.ready_add(back)
end

-- frontier_due(now, most)
--   Moves at most most waiting queues whose time has come (server ms now) back to ready.
local function frontier_due(now, most)
  local due = redis_call('ZRANGEBYSCORE', F.waiting, '-inf', int_str(now), 'LIMIT', '0',
    num_str(most))
  if #due > 0 then FP.wake(due) end
end

-- FP.read_head(q)
--   Reads the element at the head of candidate queue q (a table of frontier_take: its
--   elements read so far, from list index q.lo) into q.e, q.id, q.place, q.at (lib/frontier
--   FP.element_head) and q.score, q.score_s (its score as text when it is its id: an element
--   as enqueued at priority 0 of a fifo queue, else nil); q.e nil past the queue's end. The
--   next read takes q.size elements (0: the last read reached the queue's end).
function FP.read_head(q)
  local k = q.pos - q.lo + 1
  if k > #q.buf then
    q.e = nil
    if q.size == 0 then return end
    q.buf = FP.queue_call('LRANGE', F.queues .. q.qid, num_str(q.pos),
      num_str(q.pos + q.size - 1))
    q.lo, k = q.pos, 1
    q.size = #q.buf < q.size and 0 or math_min(q.size * 2, FP.MOST_READ)
  end
  local e = q.buf[k]
  q.e = e
  if not e then return end
  local id, place, at = FP.element_head(e)
  q.id, q.place, q.at = id, place, at
  -- FP.element_score written out (called for every element the lease reads)
  if place then
    q.score, q.score_s = score_of(q.prio, place), nil
  else
    -- (not start and F.lifo): a start queue's own order, also where it is FIFO in a LIFO crawl
    q.score = pending_score(q.prio, tonumber(id) or 0,
      (q.start and F.start_lifo) or (not q.start and F.lifo), q.start)
    q.score_s = (q.plain and id ~= '') and id or nil
  end
end

-- frontier_take(n, admit, give, corrupt, most_looks)
--   Leases up to n requests in Scrapy's order: the best head of the ready queues first.
--   admit(host, id, qid) returns wait (ms before it may start: it goes) or nil, untl (its
--   host may not go now: its queue waits until server time untl). give(id, payload, score,
--   score_s, host, came_back, wait) takes a request (score_s: its score as text, or nil;
--   came_back: it was leased before). corrupt(e, host) takes an element without an id (it
--   cannot be leased). At most most_looks queues are parked or elements set aside in one
--   call. The queues frontier_open's skip names are passed over unread (FP.MOST_PASSED).
--   Returns the number given.
--   Rule: only the n first ready queues can hold the n first requests; a queue that must
--   wait leaves ready (its requests are not read again until it may go) and the next ready
--   queue takes its place among the candidates.
local function frontier_take(n, admit, give, corrupt, most_looks)
  local heap, seen, ranked = {}, {}, 0
  -- read_ready(count): makes the next count queues of ready that hold requests candidates
  -- (fewer at ready's end). A queue ready names that holds nothing (its list deleted behind
  -- the index: by hand, an eviction, a flush while workers run) is dropped from ready at
  -- the call's end and the next one is read in its place: at most FP.MOST_GONE such
  -- entries in one call (FP.GONE), the rest by the next calls (a loop, not a recursion per
  -- batch: Lua's C stack overflowed past about 20,000 levels, failing the call after its
  -- first writes, and every call after it).
  local function read_ready(count)
    while count > 0 and FP.GONE < FP.MOST_GONE and FP.PASSED < FP.MOST_PASSED do
      local r = redis_call('ZRANGE', F.ready, num_str(ranked), num_str(ranked + count - 1))
      ranked = ranked + #r
      local asked = count
      for i = 1, #r do
        local prio, start, host = FP.queue_parts(r[i])
        if FP.N_SKIP > 0 and FP.skipped(prio, host or '-') then
          -- passed over: not a candidate, not read, left as it is (it stays in ready)
          FP.PASSED = FP.PASSED + 1
        else
          -- every field a candidate gets (FP.read_head's, ended) is named here, so that its
          -- table is made at its full size once instead of growing by rehashes (measured: 1.5 %
          -- of a sync call's instructions at 10 leases); 16 fields at most, the size of its
          -- hash part (17 would double it: more memory made and collected per queue read)
          local q = {qid = r[i], prio = prio or 0, start = start, host = host or '-', pos = 0,
            lo = 0, buf = {}, size = FP.FIRST_READ, plain = prio == 0 and not start and not F.lifo,
            e = false, id = '', place = false, at = 0, score = 0, score_s = false, ended = false}
          seen[#seen + 1] = q
          FP.read_head(q)
          if q.e then
            HEAP.push(heap, q)
            count = count - 1
          else
            q.ended = 'empty' -- dropped from ready at the end; one more candidate is read
            FP.GONE = FP.GONE + 1
          end
        end
      end
      if #r < asked then break end -- the end of ready
    end
  end
  local function advance(q)
    q.pos = q.pos + 1
    FP.read_head(q)
    if q.e then
      HEAP.down(heap, 1)
    else
      q.ended = 'empty'
      HEAP.pop(heap)
    end
  end
  read_ready(n)
  local given, looks = 0, 0
  while given < n and #heap > 0 and looks <= most_looks do
    local q = heap[1]
    if q.id == '' then
      corrupt(q.e, q.host)
      looks = looks + 1
      FP.DELTA = FP.DELTA - 1
      advance(q)
      read_ready(1)
    else
      local wait, untl = admit(q.host, q.id, q.qid)
      if wait then
        give(q.id, str_sub(q.e, q.at), q.score, q.score_s, q.host, q.place ~= nil, wait)
        given = given + 1
        FP.DELTA = FP.DELTA - 1
        advance(q)
      else
        q.ended = 'parked'
        frontier_park(q.qid, untl)
        HEAP.pop(heap)
        looks = looks + 1
        ranked = ranked - 1
        read_ready(1)
      end
    end
  end
  local back, gone = {}, {}
  for _, q in ipairs(seen) do
    if q.pos > 0 then FP.queue_call('LTRIM', F.queues .. q.qid, num_str(q.pos), '-1') end
    if q.ended == 'empty' then
      gone[#gone + 1] = q.qid
    elseif not q.ended then
      back[#back + 1] = q.score_s or int_str(q.score)
      back[#back + 1] = q.qid
    end
  end
  FP.ready_add(back)
  if #gone > 0 then batched('ZREM', F.ready, gone, 1) end
  return given
end

-- frontier_close()
--   Writes the change this call made to the count of queued requests (a count overwritten
--   with garbage starts again; frontier_pending floors it). Call it once, at the end.
local function frontier_close()
  if FP.DELTA == 0 then return end
  if type(redis_pcall('INCRBY', F.queued, num_str(FP.DELTA))) ~= 'number' then
    redis_call('SET', F.queued, num_str(math_max(FP.DELTA, 0)))
  end
  FP.DELTA = 0
end

-- frontier_pending(check, fix)
--   Returns the number of pending requests (after frontier_close): the count kept. With
--   check true, or a count of 0 or less, the count is checked against the queues: never
--   below the number of queues that hold requests, 0 when none does (with fix true, a count
--   left over then is reset). A sync checks when it leased nothing (the count decides
--   whether the crawl is over); a read-only caller checks and does not fix.
local function frontier_pending(check, fix)
  local n = finite(redis_call('GET', F.queued)) or 0
  if n > 0 and not check then return n end
  local queues = redis_call('ZCARD', F.ready) + redis_call('ZCARD', F.waiting)
  if queues == 0 then
    if fix and n ~= 0 then redis_call('DEL', F.queued) end
    return 0
  end
  return math_max(n, queues)
end

-- frontier_head()
--   Returns the score of the best ready queue's head ('' when none may be leased now), of
--   the queues not skipped (frontier_open): among the first FP.MOST_PASSED ready queues
--   ('' when they are all skipped: the caller holds nothing back for them).
local function frontier_head()
  if FP.N_SKIP == 0 then return redis_call('ZRANGE', F.ready, '0', '0', 'WITHSCORES')[2] or '' end
  local r = redis_call('ZRANGE', F.ready, '0', num_str(FP.MOST_PASSED - 1), 'WITHSCORES')
  for i = 1, #r, 2 do
    local prio, _, host = FP.queue_parts(r[i])
    if not FP.skipped(prio, host or '-') then return r[i + 1] end
  end
  return ''
end

-- restore_value(score, host)
--   Returns the delayed set's restore record of an entry (delayed_sc): "<pending score>
--   <host>", the score it goes back to pending with and the host of its back queue.
local function restore_value(score, host)
  return int_str(score) .. ' ' .. host
end

-- restore_parts(v)
--   Returns score, host of a restore record: score 0 when it cannot be read; host nil for
--   a record written before the back queues (a score alone: the caller reads the host from
--   the payload, lib/stats domain_of).
local function restore_parts(v)
  local score, host = str_match(v or '', '^(%S+) (%S+)$')
  if score then return finite(score) or 0, host end
  return finite(v) or 0, nil
end
