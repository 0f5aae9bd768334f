-- units: time in microseconds, amounts in requests. Twin of algorithms/fixed_window.py.
-- State: hash {w = window start, c = count}.
local function fw_commit(key, now, ttl_ms, start, used, opened)
  if opened then
    call("HSET", key, "w", text(start), "c", text(used))
    -- The key lives to the end of its window: set once, when the window opens.
    call("PEXPIRE", key, fmt(ttl_ms))
  else
    call("HSET", key, "c", text(used))
  end
end

local function fw_in_window(key, now, start, finish, limit, cost)
  local count = 0
  local saved = call("HMGET", key, "w", "c")
  local opened = num(saved[1]) ~= start
  if not opened then
    count = num(saved[2])
  end
  local reset = 0
  if count > 0 then reset = finish - now end
  if cost > limit then
    return false, limit - count, reset, NEVER
  end
  if count + cost > limit then
    return false, limit - count, finish - now, finish - now
  end
  local used = count + cost
  if used > 0 then reset = finish - now end
  if cost == 0 then
    return true, limit - used, reset, 0
  end
  return true, limit - used, reset, 0, fw_commit, start, used, opened
end

ALGORITHMS.fixed_window = function(key, now, amount, period, capacity, cost)
  local start = now - imod(now, period)
  return fw_in_window(key, now, start, start + period, amount, cost)
end
