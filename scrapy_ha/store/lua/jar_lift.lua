-- jar_lift: the holds of the jars' failed logins lifted (`scrapy-ha dlq requeue`: the
-- credentials were mended, and the pages their failure dead-lettered go again).
-- KEYS[1] the crawl's cookies hash
-- ARGV the jars' login fields ('login:<key>', jar_login.lua)
-- A failed login "<epoch> failed <until ms>" whose pause lasts becomes "<epoch> failed 0":
-- the next page that meets the form logs in (login epoch + 1), and the jar's session is
-- still the one before the failed login (jar_merge, login_epoch).
-- Returns how many holds it lifted (a login in flight or done, a pause over, are left).
-- Rule: a failed login holds the logins back for its pause, not past the operator's mend.
--- @include "time"
local now, lifted = now_ms(), 0
for i = 1, #ARGV do
  local e, d = string.match(redis.call('HGET', KEYS[1], ARGV[i]) or '', '^(%d+) failed (%d+)$')
  if e and tonumber(d) > now then
    redis.call('HSET', KEYS[1], ARGV[i], e .. ' failed 0')
    lifted = lifted + 1
  end
end
return lifted
