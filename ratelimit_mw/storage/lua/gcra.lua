-- units: time in microseconds (and ticks: see ticks), amounts in requests.
-- Twin of algorithms/gcra.py. State: string, the theoretical arrival time (TAT),
-- "us.ticks" (ticks a whole number: an earlier version, which wrote a plain "us", reads
-- it as microseconds, less than one off; a plain "us" reads as no ticks).
local GCRA_EXACT = 4503599627370496  -- 2^52: EXACT in algorithms/gcra.py

local function gcra_ticks(amount, period, capacity)
  local a, b = period, amount
  while b > 0 do a, b = b, imod(a, b) end
  local per_us, interval = idiv(amount, a), idiv(period, a)
  if interval * capacity <= GCRA_EXACT then
    return per_us, interval
  end
  per_us = floor((GCRA_EXACT - 2 * capacity) / max(period * capacity / amount, period))
  return per_us, -idiv(-(period * per_us), amount)
end

local function gcra_commit(key, now, ttl_ms, ahead, per_us)
  call("SET", key, fmt(now + idiv(ahead, per_us)) .. "." .. text(imod(ahead, per_us)),
    "PX", fmt(ttl_ms))
end

-- With delay (microseconds: a shaped limit's longest wait), a request that fits within
-- it is admitted with its turn that far ahead, its retry saying how long it waits.
ALGORITHMS.gcra = function(key, now, amount, period, capacity, cost, delay, hit)
  -- The ticks follow from the hit's numbers alone: worked out once, kept in its table.
  local per_us, interval = hit[7], hit[8]
  if not per_us then
    per_us, interval = gcra_ticks(amount, period, capacity + (
      delay > 0 and -idiv(-(delay * amount), period) or 0))
    hit[7], hit[8] = per_us, interval
  end
  local tau = interval * capacity
  local ahead = 0
  local stored = call("GET", key)
  if stored then
    local dot = find(stored, ".", 1, true)
    local us, part
    if dot then
      us, part = tonumber(sub(stored, 1, dot - 1)), num(sub(stored, dot + 1))
    else
      us, part = tonumber(stored), 0
    end
    if us >= now then ahead = (us - now) * per_us + part end
  end
  local remaining = idiv(tau - ahead, interval)
  local reset = -idiv(-ahead, per_us)
  if cost > capacity then
    return false, remaining, reset, NEVER
  end
  local new_ahead = ahead + cost * interval
  local late = new_ahead - tau
  local wait = 0
  if late > 0 then
    wait = -idiv(-late, per_us)
    if wait > delay then
      return false, remaining, reset, wait - delay
    end
  end
  if cost == 0 then
    return true, remaining, reset, 0
  end
  local left = 0
  if late <= 0 then left = idiv(-late, interval) end
  return true, left, -idiv(-new_ahead, per_us), wait, gcra_commit, new_ahead, per_us
end
