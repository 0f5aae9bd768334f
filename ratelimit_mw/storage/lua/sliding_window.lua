-- units: time in microseconds, amounts in requests. Twin of algorithms/sliding_window.py;
-- the floating-point expressions keep the Python order of operations, bit for bit.
-- State: hash {w = window start, c = current count, p = previous count}.

-- The weighted count of the sliding window ending at t, then what it is made of: the
-- start of t's window, its count, the previous window's, and the saved window's start.
local function swc_at(saved, t, period)
  local start = t - imod(t, period)
  local window, current, previous = num(saved[1]), 0, 0
  if window == start then
    current, previous = num(saved[2]), num(saved[3])
  elseif window == start - period then
    previous = num(saved[2])
  end
  return previous * ((period - (t - start)) / period) + current, start, current, previous,
    window
end

local function swc_admits(saved, t, limit, period, cost)
  return swc_at(saved, t, period) + cost <= limit
end

local function swc_retry_at(saved, now, limit, period, cost)
  local _, start, current, previous = swc_at(saved, now, period)
  local t
  if current + cost <= limit then
    t = start + ceil(period - (limit - current - cost) / previous * period)
  else
    t = start + period + ceil(period - (limit - cost) / current * period)
  end
  -- As in Python: the guess, else bisection up to the end of the next window.
  local bound = start + 2 * period
  t = min(max(t, now + 1), bound)
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
    local middle = floor((low + high) / 2)
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
    call("HSET", key, "w", text(start), "c", text(current), "p", text(previous))
    -- The key lives to the end of the window after this one: set once per window.
    call("PEXPIRE", key, fmt(ttl_ms))
  else
    call("HSET", key, "c", text(current))
  end
end

ALGORITHMS.sliding_window = function(key, now, amount, period, capacity, cost)
  local limit = amount
  local saved = call("HMGET", key, "w", "c", "p")
  -- swc_at(saved, now, period), inlined: this runs on every request.
  local start = now - imod(now, period)
  local window, current, previous = num(saved[1]), 0, 0
  if window == start then
    current, previous = num(saved[2]), num(saved[3])
  elseif window == start - period then
    previous = num(saved[2])
  end
  local used = previous * ((period - (now - start)) / period) + current
  local reset = 0
  if current > 0 then
    reset = start + 2 * period - now
  elseif previous > 0 then
    reset = start + period - now
  end
  if cost > limit then
    return false, floor(limit - used), reset, NEVER
  end
  if used + cost > limit then
    return false, floor(limit - used), reset,
      swc_retry_at(saved, now, limit, period, cost) - now
  end
  if cost == 0 then
    return true, floor(limit - used), reset, 0
  end
  return true, floor(limit - used - cost), start + 2 * period - now, 0, swc_commit,
    start, current + cost, previous, window ~= start
end
