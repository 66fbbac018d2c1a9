-- due: when the delayed set's entries are due, sampled by rank (read only): the set is cut
-- in at most ARGV[1] buckets of consecutive ranks, each given by its latest due time and
-- its size, so that a tool reckons with the delayed work (an ETA) in one small call
-- whatever the set's size, and never before the last entry is due.
-- KEYS[1] delayed
-- ARGV[1] the most buckets
-- Returns {due1, n1, due2, n2, ...} soonest first (due: server ms; n: entries it stands for).
local n, most = redis.call('ZCARD', KEYS[1]), tonumber(ARGV[1])
if not most or most < 1 then
  return redis.error_reply('ERR due: ARGV[1] must be a number of buckets above 0')
end
local step = math.ceil(n / most)
local out = {}
local start = 0
while start < n do
  local last = math.min(n, start + step) - 1
  local row = redis.call('ZRANGE', KEYS[1], last, last, 'WITHSCORES')
  if row[2] then
    out[#out + 1] = row[2]
    out[#out + 1] = last - start + 1
  end
  start = last + 1
end
return out
