-- archived: record that one SQL archive (a sink) holds these versions of dead letters
-- (the marks' rule: lib/deadletter). lib/deadletter's archived() reads the version alone:
-- retention and purge drop an entry once any sink holds its current version.
-- KEYS[1] dead_archived
-- ARGV[1] sink id (no space), then pairs: entry id, its dead-letter time (ms)
-- Returns the number of entries the sink holds at the given versions now.
--- @include "deadletter"
local n = 0
for i = 2, #ARGV, 2 do
  if mark_archived(KEYS[1], ARGV[i], ARGV[i + 1], ARGV[1]) then n = n + 1 end
end
return n
