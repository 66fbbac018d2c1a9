-- lib/lease: the lease record, kept in the leases hash under the entry id as
-- "<token> <pending score> <domain>" (the score the entry goes back to pending with; the
-- host of its URL, so that the script that ends the lease counts it per domain without
-- reading the payload).
--
-- lease_record(token, score, domain)
--   Returns the record of a lease (score as given: a number or the string ZRANGE read).
local function lease_record(token, score, domain)
  return token .. ' ' .. score .. ' ' .. domain
end

-- lease_domain(record)
--   Returns the domain a record keeps, '-' when it has none.
local function lease_domain(record)
  return string.match(record or '', '^%S+ %S+ (%S+)') or '-'
end

-- lease_score(record)
--   Returns the pending score a record keeps, or nil when the record cannot be read
--   (missing, or a score that is not a number).
local function lease_score(record)
  return tonumber(string.match(record or '', '^%S+ (%S+)') or '')
end

-- lease_current(leases, id, token)
--   KEYS: leases, the leases hash (the caller's KEYS[i])
--   Returns the lease record of entry id when token is its current lease token, else nil.
--   Rule: fencing. A worker acts on an entry (ack, retry, dead-letter, release, renew,
--   checkpoint, yield children) only while it holds the entry's current token; a worker
--   whose lease expired and was given to another is refused.
local function lease_current(leases, id, token)
  if not (id and token) then return nil end
  local record = redis.call('HGET', leases, id)
  if record and string.match(record, '^(%S+)') == token then return record end
  return nil
end
