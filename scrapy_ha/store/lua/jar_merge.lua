-- jar_merge: merge one worker's changes into one cookie jar of the crawl and bump the jar's
-- version, atomically. A worker's change never erases another worker's cookies: only the
-- cookies it set or dropped change, and the jar's expired cookies go (lib/jars drop_expired);
-- a jar that is not JSON is set aside (lib/jars) and the merge starts from an empty one.
-- KEYS[1] the crawl's cookies hash
-- ARGV[1] the jar's field  ARGV[2] its version field
-- ARGV[3] JSON object {cookie id: cookie} to set  ARGV[4] JSON array of cookie ids to drop
-- ARGV[5] the jars' TTL (ms; 0: none), set again at each merge
-- ARGV[6] the version of the jar the worker knows
-- Returns {the jar's version before the merge, its new version}. The new one is past both
-- the stored version and ARGV[6]: a jar whose hash was lost (TTL, flush) starts again above
-- the versions stamped on the requests still queued, instead of at 1 below them.
--- @include "time"
--- @include "jars"
local jar = jar_read(KEYS[1], ARGV[1])
for id, cookie in pairs(cjson.decode(ARGV[3])) do jar[id] = cookie end
for _, id in ipairs(cjson.decode(ARGV[4])) do jar[id] = nil end
drop_expired(jar, math_floor(now_ms() / 1000))
jar_write(KEYS[1], ARGV[1], jar)
local before = tonumber(redis.call('HGET', KEYS[1], ARGV[2])) or 0
local version = math_max(before, tonumber(ARGV[6]) or 0) + 1
redis.call('HSET', KEYS[1], ARGV[2], version)
if tonumber(ARGV[5]) > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
return {before, version}
