-- lib/lately: the workers of a crawl lately, alive or gone, for `scrapy-ha report` (a worker
-- that left is no longer in the workers set: the report of a window must still name it).
--   seen sorted set: worker id -> its last heartbeat (server ms)

-- SEEN_KEPT_MS: a week, the longest window a weekly report asks for; a few dozen bytes per
-- worker.
local SEEN_KEPT_MS = 7 * 86400000

-- seen_mark(seen, worker, now)
--   KEYS: the seen sorted set (the caller's KEYS[i])
--   Rule: each heartbeat moves the worker's time; a worker not seen for SEEN_KEPT_MS is
--   dropped.
local function seen_mark(seen, worker, now)
  redis.call('ZADD', seen, now, worker)
  redis.call('ZREMRANGEBYSCORE', seen, '-inf', now - SEEN_KEPT_MS)
end
