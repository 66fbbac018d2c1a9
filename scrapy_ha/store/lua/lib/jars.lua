-- lib/jars: the shared cookie jars of a crawl, one hash (scrapy_ha/store/jars.py):
-- 'jar:<key>' -> JSON {cookie id: cookie}, 'v:<key>' -> the jar's version, and
-- 'bad-jar:<key>' -> a jar that was not JSON, set aside (kept for a look, never read again),
-- 'login:<key>' -> the state of the jar's logins (jar_login.lua).
--
-- jar_read(cookies, field)
--   KEYS: cookies, the crawl's cookies hash (the caller's KEYS[i])
--   Returns the jar stored in field as a table ({} when there is none); a jar that is not
--   a JSON object is set aside first, and {} returned.
local function jar_read(cookies, field)
  local stored = redis.call('HGET', cookies, field)
  if not stored then return {} end
  local ok, jar = pcall(cjson.decode, stored)
  if ok and type(jar) == 'table' then return jar end
  redis.call('HSET', cookies, 'bad-' .. field, stored)
  return {}
end

-- jar_write(cookies, field, jar)
--   KEYS: cookies, the crawl's cookies hash (the caller's KEYS[i])
--   Stores jar (a table) in field, or deletes the field when the jar is empty.
local function jar_write(cookies, field, jar)
  if next(jar) == nil then
    redis.call('HDEL', cookies, field)
  else
    redis.call('HSET', cookies, field, cjson.encode(jar))
  end
end

-- drop_expired(jar, now_s)
--   Drops from jar (a table) the cookies that expired (expires <= now_s, in seconds).
--   Returns how many it dropped.
--   Rule: a cookie past its expiry is never sent again: no jar keeps it (a broad crawl's
--   default jar would otherwise grow for ever).
local function drop_expired(jar, now_s)
  local n = 0
  for id, c in pairs(jar) do
    local expires = type(c) == 'table' and tonumber(c.expires) or nil
    if expires and expires <= now_s then
      jar[id] = nil
      n = n + 1
    end
  end
  return n
end

-- end_sessions(cookies, now_s)
--   KEYS: cookies, the crawl's cookies hash (the caller's KEYS[i])
--   Drops every jar's session cookies (no expiry: http.cookiejar marks them 'discard') and
--   its expired ones (expires <= now_s); a jar left empty is deleted; a jar that is not JSON
--   is left to the worker that reads it next (it sets it aside); the jars' login states go
--   (the next run's first expiry logs in anew).
--   Returns the number of cookies dropped.
--   Rule: a session belongs to the run that opened it; the cookies that last stay.
local function end_sessions(cookies, now_s)
  local dropped = 0
  local all = redis.call('HGETALL', cookies)
  for i = 1, #all, 2 do
    local ok, jar = false, nil
    if string.sub(all[i], 1, 4) == 'jar:' then ok, jar = pcall(cjson.decode, all[i + 1]) end
    if string.sub(all[i], 1, 6) == 'login:' then redis.call('HDEL', cookies, all[i]) end
    if ok and type(jar) == 'table' then
      local kept, n = {}, 0
      for id, c in pairs(jar) do
        local expires = type(c) == 'table' and tonumber(c.expires) or nil
        if type(c) ~= 'table' or c.discard == true or (expires and expires <= now_s) then
          n = n + 1
        else
          kept[id] = c
        end
      end
      if n > 0 then jar_write(cookies, all[i], kept) end
      dropped = dropped + n
    end
  end
  return dropped
end
