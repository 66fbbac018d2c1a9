-- retry: move a leased entry to the delayed set (never both, never neither), fenced by token.
-- The retry replaces the original: same entry id, new payload (attempt counters, history).
-- With a priority, the entry comes back with that priority and its place in the order
-- (the sequence part of its score): a retry whose priority was lowered goes after fresh work.
-- KEYS[1] leased  KEYS[2] leases  KEYS[3] delayed  KEYS[4] delayed_sc  KEYS[5] payload
-- ARGV[1] entry id  ARGV[2] lease token  ARGV[3] delay (ms)  ARGV[4] new payload ('' = keep)
-- ARGV[5] priority ('' = keep the original's), clamped to -4095 .. 4095
-- Returns the due time (server ms), or 0 when the token is stale (nothing changes).
local PRIO = 1099511627776
local delay, prio = tonumber(ARGV[3]), tonumber(ARGV[5] or '')
if not delay or ((ARGV[5] or '') ~= '' and not prio) then
  return redis.error_reply('ERR retry: delay and priority must be numbers')
end
-- A key of the wrong type fails here, before any write: the entry stays where it was
-- (the worker sets the key aside and retries the call).
local TYPES = {[1] = 'zset', [2] = 'hash', [3] = 'zset', [4] = 'hash', [5] = 'hash'}
for i, want in pairs(TYPES) do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  if ty ~= 'none' and ty ~= want then
    return redis.error_reply('WRONGTYPE retry: ' .. KEYS[i] .. ' holds a ' .. ty)
  end
end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not (v and string.match(v, '^(%S+)') == ARGV[2]) then
  return 0
end
local score = tonumber(string.match(v, '^%S+ (%S+)') or '') or 0
if prio then
  prio = math.max(-4095, math.min(4095, prio))
  score = -prio * PRIO + score % PRIO
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + delay
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], due, ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], string.format('%.0f', score))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[5], ARGV[1], ARGV[4])
end
return due
