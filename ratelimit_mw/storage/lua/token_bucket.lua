-- units: time in microseconds, tokens in requests. Twin of algorithms/token_bucket.py;
-- the floating-point expressions keep the Python order of operations, bit for bit.
-- State: hash {t = tokens (a float, stored with 17 significant digits), l = last refill}.
local function tb_available(tokens, last, t, capacity, rate)
  if not tokens then return capacity end
  if t - last >= ceil((capacity - tokens) / rate) then return capacity end
  return min(capacity, tokens + max(0, t - last) * rate)
end

local function tb_first(tokens, last, low, t, want, capacity, rate)
  t = max(t, low)
  while t > low and tb_available(tokens, last, t - 1, capacity, rate) >= want do
    t = t - 1
  end
  while tb_available(tokens, last, t, capacity, rate) < want do
    t = t + 1
  end
  return t
end

local function tb_commit(key, now, ttl_ms, left)
  -- Whole tokens (a full bucket less the cost: often the same) print alike either way.
  local tokens = left % 1 == 0 and text(left) or format("%.17g", left)
  call("HSET", key, "t", tokens, "l", fmt(now))
  call("PEXPIRE", key, fmt(ttl_ms))
end

ALGORITHMS.token_bucket = function(key, now, amount, period, capacity, cost)
  local rate = amount / period
  local saved = call("HMGET", key, "t", "l")
  local stored, last = tonumber(saved[1]), tonumber(saved[2])
  local tokens, reset = capacity, 0
  if stored then
    tokens = tb_available(stored, last, now, capacity, rate)
    local full_at = last + ceil((capacity - stored) / rate)
    if full_at > now then reset = full_at - now end
  end
  if cost > capacity then
    return false, floor(tokens), reset, NEVER
  end
  if tokens < cost then
    -- From the last refill, still ahead after the clock stepped back (see Python).
    local start = now
    if stored and last > now then start = last end
    local retry = tb_first(stored, last, now + 1, start + ceil((cost - tokens) / rate),
      cost, capacity, rate) - now
    return false, floor(tokens), reset, retry
  end
  if cost == 0 then
    return true, floor(tokens), reset, 0
  end
  local left = tokens - cost
  return true, floor(left), ceil((capacity - left) / rate), 0, tb_commit, left
end
