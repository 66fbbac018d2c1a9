-- proxy_cd_load: the proxy cool-downs still running, the others (over or unreadable) deleted
-- in the same step: a cool-down another worker writes meanwhile is never deleted unread.
-- KEYS[1] the crawl's proxy cool-downs hash (proxy id -> until, ms of the server's clock)
-- ARGV[1] now (ms of the server's clock)
-- Returns a flat list {proxy id, until, ...} of the cool-downs that end after ARGV[1].
local now = tonumber(ARGV[1])
local flat = redis.call('HGETALL', KEYS[1])
local running = {}
for i = 1, #flat, 2 do
  -- (plain decimal digits only: 'inf', '1e400' or '0x1F' are garbage, deleted)
  local ends = string.match(flat[i + 1], '^%d+%.?%d*$') and tonumber(flat[i + 1])
  if ends and ends > now and ends < 2 ^ 53 then
    running[#running + 1] = flat[i]
    running[#running + 1] = flat[i + 1]
  else
    redis.call('HDEL', KEYS[1], flat[i])
  end
end
return running
