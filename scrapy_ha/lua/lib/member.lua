-- lib/member: a pending entry is one sorted-set member "<id> <payload>" (no separate payload
-- while it waits: that keeps a queued request small). Entry ids never hold a space.
--
-- member(id, payload)
--   Returns the pending member of entry id.
local function member(id, payload)
  return id .. ' ' .. payload
end

-- split_member(m)
--   Returns id, payload of a pending member: the id is '' when the member starts with a
--   space (it cannot be leased: corrupt), the payload '' when there is no space at all.
local function split_member(m)
  local space = string.find(m, ' ', 1, true)
  if not space then return m, '' end
  return string.sub(m, 1, space - 1), string.sub(m, space + 1)
end

-- valid_id(id)
--   Returns true when id can name an entry in a member: not empty and without a space
--   (the first space ends the id).
local function valid_id(id)
  return id ~= '' and not string.find(id, ' ', 1, true)
end
