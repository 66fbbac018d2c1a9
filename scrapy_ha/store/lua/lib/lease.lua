--- @include "number"
-- lib/lease: the lease record, kept in the leases hash under the entry id as
-- "<token> <pending score> <domain>" (the score the entry goes back to pending with; the
-- host of its URL, so that the script that ends the lease counts it per domain without
-- reading the payload), followed by " h" once the worker reported the request handed to its
-- engine (see renew.lua): only the expiry of such a lease counts toward poison.
--
-- lease_record(token, score, domain)
--   Returns the record of a lease (score as given: a number or the string ZRANGE read).
local function lease_record(token, score, domain)
  return token .. ' ' .. score .. ' ' .. domain
end

-- lease_domain(record)
--   Returns the domain a record keeps, '-' when it has none.
local function lease_domain(record)
  return str_match(record or '', '^%S+ %S+ (%S+)') or '-'
end

-- lease_handed(record)
--   Returns true when the record says its request was handed to the worker's engine.
local function lease_handed(record)
  return str_match(record or '', '^%S+ %S+ %S+ h$') ~= nil
end

-- lease_mark_handed(record)
--   Returns the record marked as handed to the engine (a record of two fields, written
--   before records kept a domain, gets '-' for it, so the mark is never read as a domain).
local function lease_mark_handed(record)
  if str_match(record, '^%S+ %S+$') then return record .. ' - h' end
  return record .. ' h'
end

-- lease_score(record)
--   Returns the pending score a record keeps, or nil when the record cannot be read
--   (missing, or a score that is not a number).
local function lease_score(record)
  return finite(str_match(record or '', '^%S+ (%S+)'))
end

-- lease_token(record)
--   Returns the token of a lease record (nil for no record).
local function lease_token(record)
  return record and str_match(record, '^(%S+)')
end

-- lease_parts(record)
--   Returns the token and the domain of a lease record (nil, nil for no record; domain
--   '-' when it keeps none), read at once.
local function lease_parts(record)
  if not record then return nil, nil end
  local token, domain = str_match(record, '^(%S+) %S+ (%S+)')
  if token then return token, domain end
  return str_match(record, '^(%S+)'), '-'
end

-- lease_matches(record, token)
--   Returns true when record (a lease record, or nil) is the lease of token.
--   Rule: fencing. A worker acts on an entry (ack, retry, dead-letter, release, renew,
--   checkpoint, yield children) only while it holds the entry's current token; a worker
--   whose lease expired and was given to another is refused.
local function lease_matches(record, token)
  return token ~= nil and lease_token(record) == token
end

-- lease_current(leases, id, token)
--   KEYS: leases, the leases hash (the caller's KEYS[i])
--   Returns the lease record of entry id when token is its current lease token, else nil
--   (lease_matches).
local function lease_current(leases, id, token)
  if not (id and token) then return nil end
  local record = redis_call('HGET', leases, id)
  if lease_matches(record, token) then return record end
  return nil
end

-- expiry_counts(value)
--   Reads an entry's value in the expiries hash: "<counted> <all>", the expiries of its
--   leases that count toward poison (the request had been handed to an engine) and all of
--   them (it may only have waited in a buffer). A single number (older data) is both; garbage
--   is 0, 0 (a count overwritten with garbage starts again).
--   Returns counted, all.
local function expiry_counts(value)
  local function as_count(s)
    local n = tonumber(s or '')
    if not (n and n >= 0 and n < 2147483648) then return 0 end -- NaN, inf, huge: garbage
    return math_floor(n)
  end
  local counted, all = str_match(value or '', '^(%d+) (%d+)$')
  if counted then
    counted = as_count(counted)
    return counted, math_max(counted, as_count(all))
  end
  local n = as_count(value)
  return n, n
end

-- expiry_value(counted, all)
--   Returns the value of the expiries hash for these counts (see expiry_counts).
local function expiry_value(counted, all)
  return str_format('%d %d', counted, all)
end
