-- lib/stream: the crawl's item stream (lib/commit adds to it; sinks read it with consumer
-- groups, one group per sink, and acknowledge an entry once their sink committed it).
-- Rule: an entry leaves the stream only once every consumer group of the stream has
-- acknowledged it (delivered, and no longer pending in the group); a stream that no group
-- reads yet keeps every entry.

-- stream_id(id)
--   Returns the two numbers of a stream entry id "<ms>-<seq>" (0, 0 for what is not one).
local function stream_id(id)
  local ms, seq = string.match(id or '', '^(%d+)%-(%d+)$')
  return tonumber(ms) or 0, tonumber(seq) or 0
end

-- stream_try_field(id, group)
--   Returns the field of entry *id* of *group* in the consumers' single-write attempts
--   (items_tries): '<entry id> <group>', as the queue's _try_field writes it.
local function stream_try_field(id, group)
  return id .. ' ' .. group
end

-- stream_fields(group)
--   Returns the fields of one group as XINFO GROUPS lists them ({name, consumers, pending,
--   last-delivered-id, entries-read, lag, ...}) as a table by name.
local function stream_fields(group)
  local f = {}
  for j = 1, #group, 2 do f[group[j]] = group[j + 1] end
  return f
end

-- stream_floor(stream)
--   KEYS: stream (the caller's KEYS[i])
--   Returns the id "<ms>-<seq>" below which every group has acknowledged every entry (the
--   oldest entry pending in a group, else the one after the last a group was delivered),
--   or nil when no group reads the stream.
local function stream_floor(stream)
  local groups = redis.call('XINFO', 'GROUPS', stream)
  local floor_ms, floor_seq
  for _, g in ipairs(groups) do
    local f = stream_fields(g)
    local ms, seq
    if (tonumber(f['pending']) or 0) > 0 then
      ms, seq = stream_id(redis.call('XPENDING', stream, f['name'])[2])
    else
      ms, seq = stream_id(f['last-delivered-id'])
      seq = seq + 1
    end
    if not floor_ms or ms < floor_ms or (ms == floor_ms and seq < floor_seq) then
      floor_ms, floor_seq = ms, seq
    end
  end
  if not floor_ms then return nil end
  return string.format('%.0f-%.0f', floor_ms, floor_seq)
end
