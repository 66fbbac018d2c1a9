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
  return math_max(-MAX_PRIORITY, math_min(MAX_PRIORITY, p))
end

-- START_PART: where start requests begin in the sequence part of a score: at equal priority
-- every other request (part below it) goes first, as from Scrapy's own start queues.
local START_PART = PRIORITY_STEP / 2

-- place_of(seq, lifo, start)
--   Returns the place within its priority (the sequence part of the score) of the request
--   of sequence number seq.
--   Rule: a lower place goes first: with start true (a start request kept in its own
--   queue), after every other request of that priority; then by seq, ascending (fifo) or
--   descending (lifo, Scrapy's default: depth-first).
local function place_of(seq, lifo, start)
  local part = lifo and (START_PART - seq) or seq
  if start then part = part + START_PART end
  return part
end

-- score_of(prio, place)
--   Returns the score of a pending entry of (clamped) priority prio at place (place_of).
--   Rule: a lower score is leased first: a higher priority first, then the lower place.
local function score_of(prio, place)
  return -prio * PRIORITY_STEP + place
end

-- pending_score(prio, seq, lifo, start)
--   Returns the score of a pending entry of (clamped) priority prio and sequence number seq
--   (see place_of and score_of: written out here, not called, as the lease and the enqueue
--   compute it for every element they read or write).
local function pending_score(prio, seq, lifo, start)
  local part = lifo and (START_PART - seq) or seq
  if start then part = part + START_PART end
  return -prio * PRIORITY_STEP + part
end

-- score_parts(score)
--   Returns prio, place, start of a score: its priority, its place within it, and whether
--   it is a start request's kept in their own queue (its place at or past START_PART).
local function score_parts(score)
  local part = score % PRIORITY_STEP
  return (part - score) / PRIORITY_STEP, part, part >= START_PART
end

-- with_priority(score, prio)
--   Returns score moved to (clamped) priority prio, keeping its place in the order (the
--   sequence part of the score).
local function with_priority(score, prio)
  return score_of(prio, score % PRIORITY_STEP)
end
