-- lib/priority: the pending score, priority first, then the arrival order.
-- The loader (scrapy_ha/store/scripts.py) writes the two constants from Python, their one
-- definition, so the scripts and the worker clamp the same way.
--
-- PRIORITY_STEP: score units per priority step; the sequence part of a score stays below it.
local PRIORITY_STEP = {{PRIORITY_STEP}}
-- MAX_PRIORITY: priorities are clamped to -MAX_PRIORITY .. MAX_PRIORITY, so that every score
-- stays an exact double (below 2^53).
local MAX_PRIORITY = {{MAX_PRIORITY}}

-- clamp_priority(p)
--   Returns the number p clamped to -MAX_PRIORITY .. MAX_PRIORITY.
local function clamp_priority(p)
  return math.max(-MAX_PRIORITY, math.min(MAX_PRIORITY, p))
end

-- START_PART: where start requests begin in the sequence part of a score: at equal priority
-- every other request (part below it) goes first, as from Scrapy's own start queues.
local START_PART = PRIORITY_STEP / 2

-- pending_score(prio, seq, lifo, start)
--   Returns the score of a pending entry of (clamped) priority prio and sequence number seq.
--   Rule: a lower score is leased first: a higher priority first; then, with start true (a
--   start request kept in its own queue), after every other request of that priority; then
--   by seq, ascending (fifo) or descending (lifo, Scrapy's default: depth-first).
local function pending_score(prio, seq, lifo, start)
  local part = lifo and (START_PART - seq) or seq
  if start then part = part + START_PART end
  return -prio * PRIORITY_STEP + part
end

-- with_priority(score, prio)
--   Returns score moved to (clamped) priority prio, keeping its place in the order (the
--   sequence part of the score).
local function with_priority(score, prio)
  return -prio * PRIORITY_STEP + score % PRIORITY_STEP
end
