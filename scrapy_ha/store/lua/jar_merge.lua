-- jar_merge: merge one worker's changes into one cookie jar of the crawl and bump the jar's
-- version, atomically. A worker's change never erases another worker's cookies: only the
-- cookies it set or dropped change, and the jar's expired cookies go (lib/jars drop_expired);
-- a jar that is not JSON is set aside (lib/jars) and the merge starts from an empty one.
-- KEYS[1] the crawl's cookies hash
-- ARGV[1] the jar's field  ARGV[2] its version field
-- ARGV[3] JSON object {cookie id: cookie} to set  ARGV[4] JSON array of cookie ids to drop
-- ARGV[5] the jars' TTL (ms; 0: none), set again at each merge
-- ARGV[6] the jar's login field (jar_login.lua)  ARGV[7] the login epoch of the session the
--   answer's request was sent with (its _ha_login_epoch; 0 when none)
-- Returns the jar's new version (an integer), or 0 when nothing changed (a deletion of a
-- cookie the jar does not hold: a page that clears a cookie at every answer): nothing is
-- written and the version stays, so the other workers load nothing; -1 when the request was
-- sent with the session of a login older than the jar's last one done, or than the login
-- request in flight (jar_login 'run', whose requests carry its epoch), or than the one
-- before a login that failed (jar_login 'failed'): nothing is written
-- (the answer to an expired session, such as a new anonymous session cookie set on the
-- redirect to the login form, would replace the new session of every worker).
--- @include "time"
--- @include "jars"
-- EXPIRY_GRACE_S: a cookie's expiry is in a worker's clock (Max-Age), the drop in the
-- server's: one expired this long ago is dropped, one the workers' clocks may still hold
-- is left to them (http.cookiejar never sends an expired one)
local EXPIRY_GRACE_S = 3600
local login = redis.call('HGET', KEYS[1], ARGV[6])
if login then
  local e, state = string.match(login, '^(%d+) (%a+) %d+$')
  -- (a failed login opened no session: the jar's is the one before it)
  if e and tonumber(e) - (state == 'failed' and 1 or 0) > tonumber(ARGV[7]) then return -1 end
end
local jar = jar_read(KEYS[1], ARGV[1])
local changed = false
for id, cookie in pairs(cjson.decode(ARGV[3])) do
  jar[id] = cookie
  changed = true
end
for _, id in ipairs(cjson.decode(ARGV[4])) do
  if jar[id] ~= nil then
    jar[id] = nil
    changed = true
  end
end
if drop_expired(jar, math_floor(now_ms() / 1000) - EXPIRY_GRACE_S) > 0 then changed = true end
if not changed then return 0 end
jar_write(KEYS[1], ARGV[1], jar)
local version = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
return version
