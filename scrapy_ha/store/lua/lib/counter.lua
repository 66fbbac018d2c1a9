--- @include "time"
--- @include "number"
-- lib/counter: the counters that number entries (seq) and lease tokens (lseq).
--
-- take(counter, n)
--   KEYS: counter, a string key holding an integer (the caller's KEYS[i])
--   Reserves n numbers; returns base, so that base + 1 .. base + n are this call's.
--   Rule: a counter overwritten with garbage restarts above any number it can have given
--   (the server's unix seconds), instead of failing the script half-way.
local function take(counter, n)
  local v = redis_pcall('INCRBY', counter, num_str(n))
  if type(v) == 'number' then return v - n end
  local base = math_floor(now_ms() / 1000)
  redis_call('SET', counter, base + n)
  return base
end

-- take_ids(counter, n)
--   Reserves n sequence numbers for entry ids (take), the first at a multiple of 100 plus
--   one; returns base: base + 1 .. base + n are this call's (id_text writes them).
--   Rule: ids only ever grow; the numbers skipped to start at a hundred are never given.
local function take_ids(counter, n)
  return math_ceil(take(counter, n + 99) / 100) * 100
end

-- The text of the hundreds of this call's ids (id_text), written once per hundred.
local HUNDREDS = {}

-- id_text(x)
--   Returns the integer x (an id of take_ids, below 2^53) as text, its hundreds written once
--   per call and its last two digits cut from a constant (lib/number): no printf per id.
local function id_text(x)
  local h = math_floor(x / 100)
  if h == 0 then return num_str(x) end
  local head = HUNDREDS[h]
  if not head then
    head = int_str(h)
    HUNDREDS[h] = head
  end
  return head .. two_digits(x % 100)
end
