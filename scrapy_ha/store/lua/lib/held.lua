-- lib/held: why a delayed entry waits when it waits without an attempt, for the operator's
-- tools (the crawl page, the delayed table, `scrapy-ha delayed list`); workers never read it.
--   held hash: entry id -> '<why> <domain>': 'gate <domain>' (deferred while its domain's
--          gate was closed, by a 429 with Retry-After), 'limit <domain>' (held back for its
--          domain's crawl-wide limits, lib/polite) or 'revisit <domain>' (a page revisited
--          on a schedule, waiting for its next visit, revisit.lua), 'proxy <domain>' (no
--          usable proxy: the proxy middleware's waits, retry.lua), 'dictionary <domain>'
--          (compacted with a dictionary the crawl's key lacks, until a worker holding it
--          writes it back, retry.lua); a retry (an attempt,
--          with a failure class) has no mark; and '#<why> <domain>' -> how many entries have
--          that mark, so that a tool counts them without reading every mark (entry ids have
--          no '#')

-- held_clear(held, id)
--   KEYS: the held hash (the caller's KEYS[i])
--   Rule: the mark leaves with the wait: an entry promoted from the delayed set (due, or
--   made due by an operator) has none, so the hash holds delayed entries only, and its
--   counts are those of their marks.
--   Rule (a count never stops a script, which may have written already): a count that
--   holds garbage (written by hand) starts again; before, HINCRBY failed every call that
--   moved an entry of its domain, and each such revisit was lost for a visit. (Both counts
--   are written inline: the sync script holds at most 200 locals, libraries included.)
local function held_clear(held, id)
  local mark = redis.call('HGET', held, id)
  if not mark then return end
  redis.call('HDEL', held, id)
  local n = redis.pcall('HINCRBY', held, '#' .. mark, -1)
  if type(n) == 'table' or n <= 0 then
    redis.call('HDEL', held, '#' .. mark)
  end
end

-- held_mark(held, id, why, domain)
--   Rule: an entry moved to the delayed set without an attempt is marked with why, and
--   counted under its mark.
local function held_mark(held, id, why, domain)
  held_clear(held, id)
  local mark = why .. ' ' .. domain
  redis.call('HSET', held, id, mark)
  if type(redis.pcall('HINCRBY', held, '#' .. mark, 1)) == 'table' then
    redis.call('HSET', held, '#' .. mark, 1)
  end
end
