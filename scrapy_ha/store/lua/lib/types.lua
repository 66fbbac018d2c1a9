-- lib/types: the check that runs before a script's first write.
--
-- wrong_type(script, keys, types)
--   keys: the script's KEYS; types[i]: the Redis type keys[i] must have (nil: not checked).
--   Returns an error reply 'WRONGTYPE <script>: <key> holds a <type>' for the first key of
--   another type (a missing key is fine), or nil.
--   Rule: a key of the wrong type fails the call before any write, so the entry stays
--   where it was; the worker sets the key aside and retries the call.
local function wrong_type(script, keys, types)
  for i = 1, #keys do
    local want = types[i]
    if want then
      local ty = redis.call('TYPE', keys[i])['ok']
      if ty ~= 'none' and ty ~= want then
        return redis.error_reply('WRONGTYPE ' .. script .. ': ' .. keys[i] .. ' holds a ' .. ty)
      end
    end
  end
  return nil
end
