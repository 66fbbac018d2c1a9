-- lib/senders: the numbers of children of the workers of a crawl ('sent'), kept while a
-- worker may still send a call, and pruned once it has been gone long enough.
--
-- sender_nonce(value)
--   Returns the nonce a value of the senders hash names (nil for garbage), and the time its
--   worker was first seen gone ('' while it is not).
local function sender_nonce(value)
  return string.match(value or '', '^(%S+) ?(%d*)$')
end

-- prune_senders(senders, sent, workers, now, grace)
--   KEYS: senders (worker id -> "<nonce>", or "<nonce> <ms it was first seen gone>"), sent
--   (nonce -> its newest child stored; "<nonce>:i" -> its newest loose item), workers (heartbeats) of one crawl (the caller's KEYS)
--   Marks each worker whose heartbeat expired gone (from now), unmarks one alive again, and
--   deletes the fields (in both hashes) of those gone for grace ms or more.
--   Rule: 'sent' is read only by its own worker's calls (a round sent again skips the
--   children already stored; a newer child than the server holds refuses the call, and the
--   worker stores again the children it keeps). A worker killed never calls again; one
--   frozen (SIGSTOP, a paused VM) past its heartbeat does, and without its number it would
--   store again the start requests it keeps, into a crawl that may have finished meanwhile
--   (its dupefilter cleared): so a number is kept for grace after its worker was gone.
local function prune_senders(senders, sent, workers, now, grace)
  local all = redis.call('HGETALL', senders)
  for i = 1, #all, 2 do
    local nonce, since = sender_nonce(all[i + 1])
    local alive = tonumber(redis.call('ZSCORE', workers, all[i]))
    if not nonce then
      redis.call('HDEL', senders, all[i]) -- garbage: it names no number
    elseif alive and alive > now then
      if since ~= '' then redis.call('HSET', senders, all[i], nonce) end
    elseif since == '' then
      redis.call('HSET', senders, all[i], nonce .. ' ' .. string.format('%d', now))
    elseif now - tonumber(since) >= grace then
      redis.call('HDEL', sent, nonce, nonce .. ':i') -- its children's and loose items'
      redis.call('HDEL', senders, all[i])
    end
  end
end
