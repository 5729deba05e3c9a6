-- ringgate's shared limits (governance::store::script): one script, one operation per call,
-- each atomic. ARGV[1] = operation, ARGV[2] = lifetime of a window key in ms.
--
-- Keys (<p> = limits.redis_prefix, <k> = the key's name, <w> = unix minute):
--   <p>rpm:<k>:<w>   requests counted in window w (expires 2 windows after its last write)
--   <p>tpm:<k>:<w>   tokens counted in window w
--   <p>inflight:<k>  hash: instance -> requests that instance has in flight
--   <p>spend:<k>:<period>:<start>  nano-USD spent in a budget period (day, month, total)
--   <p>live:<i>      set by instance i, expires after the lease unless renewed
--   <p>inflight:{<k>}:live:<i>  the same, per key, on a Cluster (live-key prefix ARGV ''):
--                    in the hash's slot; set by admit and sync, renewed while i holds requests
-- An instance (one shard of one process) whose live key has expired has stopped renewing its
-- lease (crashed or cut off): its in-flight count is dropped by the next admission of that key.

local op = ARGV[1]
local ttl = tonumber(ARGV[2]) -- 0: the key never expires

local function count(k)
  return tonumber(redis.call('GET', k) or '0')
end

local function add(k, n)
  local v = redis.call('INCRBY', k, n)
  if v < 0 then
    redis.call('SET', k, 0)
    v = 0
  end
  if ttl > 0 then
    redis.call('PEXPIRE', k, ttl)
  end
  return v
end

-- instance i's live key: <live><i>, or (live = '', on a Cluster) <h>:live:<i> in h's slot
local function live_key(h, live, i)
  if live == '' then
    return h .. ':live:' .. i
  end
  return live .. i
end

local function in_flight(h, live)
  local all = redis.call('HGETALL', h)
  local n = 0
  for i = 1, #all, 2 do
    if redis.call('EXISTS', live_key(h, live, all[i])) == 1 then
      n = n + tonumber(all[i + 1])
    else
      redis.call('HDEL', h, all[i])
    end
  end
  return n
end

if op == 'admit' then
  -- KEYS: rpm window, tpm window, in-flight hash, spend of the budget period.
  -- ARGV[3] rpm (0: none), [4] max in flight (0: none), [5] tpm (0: none), [6] instance,
  -- [7] live-key prefix ('': per key, on a Cluster), [8] lifetime of the in-flight hash in ms,
  -- [9] budget in nano-USD (0: none), [10] lease in ms (a Cluster: the per-key live key is set).
  -- Returns {verdict (0 admitted, 1 over rpm, 2 over max in flight, 3 budget spent),
  -- requests, tokens, spent}.
  local rpm, max, tpm = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
  local budget = tonumber(ARGV[9])
  local r, t, s = 0, 0, 0
  if rpm > 0 then r = count(KEYS[1]) end
  if tpm > 0 then t = count(KEYS[2]) end
  if budget > 0 then
    s = count(KEYS[4])
    if s >= budget then
      return {3, r, t, s}
    end
  end
  if max > 0 and in_flight(KEYS[3], ARGV[7]) >= max then
    return {2, r, t, s}
  end
  if rpm > 0 then
    if r + 1 > rpm then
      return {1, r, t, s}
    end
    r = add(KEYS[1], 1)
  end
  if max > 0 then
    redis.call('HINCRBY', KEYS[3], ARGV[6], 1)
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[8]))
    local lease = tonumber(ARGV[10] or '0')
    if lease > 0 then
      redis.call('SET', live_key(KEYS[3], ARGV[7], ARGV[6]), 1, 'PX', lease)
    end
  end
  return {0, r, t, s}
elseif op == 'tokens' then
  -- KEYS: tpm window. ARGV[3] tpm, [4] tokens wanted. Returns {verdict (0 reserved, 1 over),
  -- tokens counted}.
  local t = count(KEYS[1])
  local want = tonumber(ARGV[4])
  if t + want > tonumber(ARGV[3]) then
    return {1, t}
  end
  return {0, add(KEYS[1], want)}
elseif op == 'lease' then
  -- KEYS: rpm window. ARGV[3] limit, [4] units wanted. Grants min(wanted, limit - counted)
  -- units (never below 0) and counts them: every unit any node holds is in the window's count,
  -- so the fleet never admits more than the limit. Returns {units granted, counted after}.
  local limit, want = tonumber(ARGV[3]), tonumber(ARGV[4])
  local c = count(KEYS[1])
  local grant = math.min(want, limit - c)
  if grant <= 0 then
    return {0, c}
  end
  return {grant, add(KEYS[1], grant)}
elseif op == 'add' then
  -- KEYS: a window or a spend counter. ARGV[3] amount (negative: give back; never below 0).
  return add(KEYS[1], tonumber(ARGV[3]))
elseif op == 'release' then
  -- KEYS: in-flight hash. ARGV[3] instance, [4] lifetime of the hash in ms.
  local v = redis.call('HINCRBY', KEYS[1], ARGV[3], -1)
  if v <= 0 then
    redis.call('HDEL', KEYS[1], ARGV[3])
  else
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]))
  end
  return v
elseif op == 'sync' then
  -- KEYS: in-flight hash. ARGV[3] instance, [4] its requests in flight, [5] lifetime in ms,
  -- [6] lease in ms (a Cluster: the per-key live key is set).
  local n = tonumber(ARGV[4])
  if n > 0 then
    redis.call('HSET', KEYS[1], ARGV[3], n)
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]))
    local lease = tonumber(ARGV[6] or '0')
    if lease > 0 then
      redis.call('SET', live_key(KEYS[1], '', ARGV[3]), 1, 'PX', lease)
    end
  else
    redis.call('HDEL', KEYS[1], ARGV[3])
  end
  return n
end
return redis.error_reply('ringgate limits: unknown operation')
