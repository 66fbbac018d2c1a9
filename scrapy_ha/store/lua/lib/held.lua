-- lib/held: why a delayed entry waits when it waits without an attempt, for the operator's
-- tools (the crawl page, the delayed table, `scrapy-ha delayed list`); workers never read it.
--   held hash: entry id -> 'gate <domain>' (deferred while its domain's gate was closed, by a
--          429 with Retry-After) or 'limit <domain>' (held back for its domain's crawl-wide
--          limits, lib/polite); a retry (an attempt, with a failure class) has no mark
--
-- held_mark(held, id, why, domain)
--   KEYS: the held hash (the caller's KEYS[i])
--   Rule: an entry moved to the delayed set without an attempt is marked with why.
local function held_mark(held, id, why, domain)
  redis.call('HSET', held, id, why .. ' ' .. domain)
end

-- held_clear(held, id)
--   Rule: the mark leaves with the wait: an entry promoted from the delayed set (due, or
--   made due by an operator) has none, so the hash holds delayed entries only.
local function held_clear(held, id)
  redis.call('HDEL', held, id)
end
