-- lib/heap: a binary min-heap of tables in a Lua array, ordered by their field score, then
-- by their field qid (a tie goes as the ready sorted set orders its members); the merge of
-- the back queues (lib/frontier) keeps its candidate queues in one.

-- (its functions are fields of one table, HEAP: a script's main function holds at most
-- 200 locals, the libraries' included)
local HEAP = {}

-- HEAP.before(a, b)
--   Returns true when a goes before b.
function HEAP.before(a, b)
  return a.score < b.score or (a.score == b.score and a.qid < b.qid)
end

-- HEAP.down(h, i)
--   Moves h[i] down to its place (after its score grew, or after it replaced the top).
function HEAP.down(h, i)
  local n = #h
  while true do
    local l, best = i * 2, i
    if l <= n and HEAP.before(h[l], h[best]) then best = l end
    if l + 1 <= n and HEAP.before(h[l + 1], h[best]) then best = l + 1 end
    if best == i then return end
    h[i], h[best] = h[best], h[i]
    i = best
  end
end

-- HEAP.push(h, x)
--   Adds x to h at its place.
function HEAP.push(h, x)
  local i = #h + 1
  h[i] = x
  while i > 1 do
    local up = math_floor(i / 2)
    if not HEAP.before(h[i], h[up]) then return end
    h[i], h[up] = h[up], h[i]
    i = up
  end
end

-- HEAP.pop(h)
--   Removes the first of h (h[1]) and returns it.
function HEAP.pop(h)
  local top, last = h[1], table.remove(h)
  if #h > 0 then
    h[1] = last
    HEAP.down(h, 1)
  end
  return top
end
