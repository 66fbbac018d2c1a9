-- leave: a worker refused after it joined (join.lua) takes its registration back, and the
-- crawl's finish record if its join replaced it: a crawl that had finished is finished
-- again, so that a worker with another shard count may still take it over. Only while the
-- record still names this worker's join: a worker that joined since (even one whose
-- registration expired: a sharded crawl's heartbeats are in another slot) deleted it.
-- KEYS[1] where the worker registered (join.lua's KEYS[3])  KEYS[2] the finish record
-- ARGV[1] worker id  ARGV[2] '1' if its join replaced a 'done' record, else '0'
-- Returns 1 if the record was written back, else 0.
redis.call('ZREM', KEYS[1], ARGV[1])
if ARGV[2] ~= '1' or redis.call('GET', KEYS[2]) ~= 'joined ' .. ARGV[1] then
  return 0
end
redis.call('SET', KEYS[2], 'done')
return 1
