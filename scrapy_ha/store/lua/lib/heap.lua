-- lib/heap: a binary min-heap of tables in a Lua array, ordered by their field score, then
-- by their field qid (a tie goes as the ready sorted set orders its members); the merge of
-- the back queues (lib/frontier) keeps its candidate queues in one.

-- (its functions are fields of one table, HEAP: a script's main function holds at most
-- 200 locals, the libraries' included)
local HEAP = {}

-- HEAP.down(h, i)
--   Moves h[i] down to its place (after its score grew, or after it replaced the top).
--   (a goes before b when a.score < b.score, or a.score == b.score and a.qid < b.qid:
--   written out in both functions, not called, as the lease moves a queue down for every
--   request it takes)
function HEAP.down(h, i)
  local n = #h
  local x = h[i]
  local xs, xq = x.score, x.qid
  while true do
    local l = i * 2
    if l > n then break end
    local c = h[l]
    if l < n then
      local r = h[l + 1]
      if r.score < c.score or (r.score == c.score and r.qid < c.qid) then
        l, c = l + 1, r
      end
    end
    if not (c.score < xs or (c.score == xs and c.qid < xq)) then break end
    h[i] = c
    i = l
  end
  h[i] = x
end

-- HEAP.push(h, x)
--   Adds x to h at its place.
function HEAP.push(h, x)
  local i = #h + 1
  local xs, xq = x.score, x.qid
  while i > 1 do
    local up = math_floor(i / 2)
    local p = h[up]
    if not (xs < p.score or (xs == p.score and xq < p.qid)) then break end
    h[i] = p
    i = up
  end
  h[i] = x
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
