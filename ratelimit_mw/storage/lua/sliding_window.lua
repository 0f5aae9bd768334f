-- units: time in microseconds, amounts in requests. Twin of algorithms/sliding_window.py;
-- the floating-point expressions keep the Python order of operations, bit for bit.
-- State: hash {w = window start, c = current count, p = previous count}.
local function swc_counts(saved, start, period)
  local w = num(saved[1])
  if not w then return 0, 0 end
  if w == start then return num(saved[2]), num(saved[3]) end
  if w == start - period then return 0, num(saved[2]) end
  return 0, 0
end

local function swc_used(current, previous, elapsed, period)
  return previous * ((period - elapsed) / period) + current
end

local function swc_admits(saved, t, limit, period, cost)
  local start = t - imod(t, period)
  local current, previous = swc_counts(saved, start, period)
  return swc_used(current, previous, t - start, period) + cost <= limit
end

local function swc_retry_at(saved, now, limit, period, cost)
  local start = now - imod(now, period)
  local current, previous = swc_counts(saved, start, period)
  local t
  if current + cost <= limit then
    t = start + math.ceil(period - (limit - current - cost) / previous * period)
  else
    t = start + period + math.ceil(period - (limit - cost) / current * period)
  end
  -- As in Python: the guess, else bisection up to the end of the next window.
  local bound = start + 2 * period
  t = math.min(math.max(t, now + 1), bound)
  local low, high
  if swc_admits(saved, t, limit, period, cost) then
    if t - 1 == now or not swc_admits(saved, t - 1, limit, period, cost) then
      return t
    end
    low, high = now, t - 1
  else
    low, high = t, bound
  end
  while high - low > 1 do
    local middle = math.floor((low + high) / 2)
    if swc_admits(saved, middle, limit, period, cost) then
      high = middle
    else
      low = middle
    end
  end
  return high
end

local function swc_commit(key, now, ttl_ms, start, current, previous, opened)
  if opened then
    redis.call("HSET", key, "w", text(start), "c", text(current), "p", text(previous))
    -- The key lives to the end of the window after this one: set once per window.
    redis.call("PEXPIRE", key, ttl_ms)
  else
    redis.call("HSET", key, "c", text(current))
  end
end

ALGORITHMS.sliding_window = function(key, now, amount, period, capacity, cost)
  local limit = amount
  local saved = redis.call("HMGET", key, "w", "c", "p")
  local start = now - imod(now, period)
  local current, previous = swc_counts(saved, start, period)
  local used = swc_used(current, previous, now - start, period)
  local reset = 0
  if current > 0 then
    reset = start + 2 * period - now
  elseif previous > 0 then
    reset = start + period - now
  end
  if cost > limit then
    return false, math.floor(limit - used), reset, NEVER
  end
  if used + cost > limit then
    return false, math.floor(limit - used), reset,
      swc_retry_at(saved, now, limit, period, cost) - now
  end
  if cost == 0 then
    return true, math.floor(limit - used), reset, 0
  end
  return true, math.floor(limit - used - cost), start + 2 * period - now, 0, swc_commit,
    start, current + cost, previous, num(saved[1]) ~= start
end
