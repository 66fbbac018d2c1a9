-- lib/priority: the pending score, priority first, then the arrival order.
-- The loader (scrapy_ha/_scripts.py) writes the two constants from Python, their one
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

-- pending_score(prio, seq, lifo)
--   Returns the score of a pending entry of (clamped) priority prio and sequence number seq.
--   Rule: a lower score is leased first: a higher priority first, then by seq, ascending
--   (fifo) or descending (lifo, Scrapy's default: depth-first).
local function pending_score(prio, seq, lifo)
  if lifo then return -prio * PRIORITY_STEP + (PRIORITY_STEP - seq) end
  return -prio * PRIORITY_STEP + seq
end

-- with_priority(score, prio)
--   Returns score moved to (clamped) priority prio, keeping its place in the order (the
--   sequence part of the score).
local function with_priority(score, prio)
  return -prio * PRIORITY_STEP + score % PRIORITY_STEP
end
