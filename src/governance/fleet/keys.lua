-- One key's change, pushed to the fleet's store (governance::fleet). Atomic: it runs on the
-- store like every script, and every key it touches carries the {fleet} hash tag (one slot on a
-- Cluster).
-- KEYS[1] the records (hash: name -> "<ver> <sha256 hex> <created> <updated> <revoked> <spec>")
-- KEYS[2] the change log (sorted set: name, scored by its record's version)
-- KEYS[3] the version counter (incremented by every write)
-- ARGV: name, sha256 hex, created, updated, revoked (0: live), spec JSON, the version this
-- change was made on ("" for none: a new key).
-- Returns {status, record}: "ok" (written), "same" (the store already holds it) or "conflict"
-- (the store's record stands: it wins, except that a revocation always lands).
local name, sha, created, updated, revoked, spec = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local base = tonumber(ARGV[7])
local function write(s, c, u, r, sp)
  local v = redis.call('INCR', KEYS[3])
  local rec = v .. ' ' .. s .. ' ' .. c .. ' ' .. u .. ' ' .. r .. ' ' .. sp
  redis.call('HSET', KEYS[1], name, rec)
  redis.call('ZADD', KEYS[2], v, name)
  return {'ok', rec}
end
local cur = redis.call('HGET', KEYS[1], name)
if not cur then
  return write(sha, created, updated, revoked, spec)
end
local cv, cs, cc, cu, cr, csp = string.match(cur, '^(%d+) (%x+) (%d+) (%d+) (%d+) (.*)$')
if not cv then
  -- not a record this script wrote: replaced
  return write(sha, created, updated, revoked, spec)
end
if cs ~= sha then
  if cr ~= '0' and revoked == '0' then
    -- the name's last key was revoked: a new key of that name
    return write(sha, created, updated, revoked, spec)
  end
  return {'conflict', cur}
end
if cr ~= '0' then
  -- revoked in the fleet: stays revoked
  if revoked ~= '0' then return {'same', cur} end
  return {'conflict', cur}
end
if revoked ~= '0' then
  -- a revocation always lands (on the fleet's settings of the key)
  return write(cs, cc, updated, revoked, csp)
end
if csp == spec then
  return {'same', cur}
end
if base == tonumber(cv) then
  -- a change of the record this node last saw
  return write(cs, cc, updated, '0', spec)
end
return {'conflict', cur}
