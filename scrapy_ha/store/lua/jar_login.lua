-- jar_login: one login per expiry of a shared cookie session (scrapy_ha.cookies.login_once).
-- A jar's login state is the field 'login:<key>' of the cookies hash: "<epoch> run <deadline
-- ms>" while a worker logs in, "<epoch> done 0" once its login's answer came, "<epoch>
-- failed <until ms>" once its answer failed the spider's check (login_once's check: wrong
-- credentials, a changed form). A worker's copy of the jar holds the session of the last
-- done epoch as of its version.
-- KEYS[1] the crawl's cookies hash
-- ARGV[1] 'claim', 'done' or 'failed'  ARGV[2] the jar's login field  ARGV[3] its version
--   field
-- ARGV[4] claim: the epoch of the session the expired request was sent with; done, failed:
--   the epoch of the login whose answer came
-- ARGV[5] claim: how long a login may take before another worker takes it over (ms);
--   failed: how long no login is made after it (ms)
-- ARGV[6] the jars' TTL (ms; 0: none), set again when a claim writes
-- While a login is in flight jar_merge takes no cookies but from its own requests (they
-- carry its epoch).
-- Returns {action, epoch, version}: for 'claim', action 0 (a login is in flight: wait and
-- ask again), 1 (a login done after the request was sent: send it again, with the jar at
-- version or later) or 2 (log in: this caller holds the login of epoch); for 'done', action
-- 1 when it marked that login done (the jar's version is bumped: a worker that loaded the
-- jar before it loads it again), 0 when another login took its place; for 'failed', 1 when
-- it marked that login failed, 0 when another login took its place. A claim while a failed
-- login's pause lasts returns {3, epoch, version, ms left}: the request must not log in
-- (LoginFailed), whatever session it was sent with.
-- Rule: a session's expiry met by many requests at once costs one login; a login whose
-- worker died or whose answer never came is taken over after ARGV[5]; a login that failed
-- costs no other login before its pause ends, on any worker (wrong credentials log in once
-- per pause, not once per page).
--- @include "time"
local field, vfield = ARGV[2], ARGV[3]
local epoch, state, deadline = 0, 'done', 0
local stored = redis.call('HGET', KEYS[1], field)
if stored then
  local e, s, d = string.match(stored, '^(%d+) (%a+) (%d+)$')
  if e then epoch, state, deadline = tonumber(e), s, tonumber(d) end
end
local version = tonumber(redis.call('HGET', KEYS[1], vfield) or '0')
if ARGV[1] == 'done' then
  if state ~= 'run' or epoch ~= tonumber(ARGV[4]) then return {0, epoch, version} end
  redis.call('HSET', KEYS[1], field, epoch .. ' done 0')
  version = redis.call('HINCRBY', KEYS[1], vfield, 1)
  return {1, epoch, version}
end
local now = now_ms()
if ARGV[1] == 'failed' then
  if state ~= 'run' or epoch ~= tonumber(ARGV[4]) then return {0, epoch, version} end
  redis.call('HSET', KEYS[1], field, epoch .. ' failed ' .. (now + tonumber(ARGV[5])))
  return {1, epoch, version}
end
if state == 'run' and now < deadline then return {0, epoch, version} end
if state == 'failed' and now < deadline then return {3, epoch, version, deadline - now} end
local done = epoch
if state ~= 'done' then done = epoch - 1 end
local sent = tonumber(ARGV[4])
if done > sent then return {1, done, version} end
-- past the request's epoch too: a hash that expired (HA_COOKIES_TTL) or was cleared starts
-- again from 0 while workers still hold later epochs
epoch = math.max(epoch, sent) + 1
redis.call('HSET', KEYS[1], field, epoch .. ' run ' .. (now + tonumber(ARGV[5])))
if tonumber(ARGV[6]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[6]) end
return {2, epoch, version}
