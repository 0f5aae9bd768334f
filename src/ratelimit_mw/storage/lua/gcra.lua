-- units: time in microseconds, amounts in requests. Twin of algorithms/gcra.py.
-- State: string, the theoretical arrival time (TAT).
ALGORITHMS.gcra = function(key, now, amount, period, capacity, cost)
  local interval = -idiv(-period, amount)
  local tau = interval * capacity
  local tat = tonumber(redis.call("GET", key))
  if not tat or tat < now then tat = now end
  local remaining = idiv(now + tau - tat, interval)
  if cost > capacity then
    return false, remaining, tat - now, NEVER
  end
  local new_tat = tat + cost * interval
  local allow_at = new_tat - tau
  if now < allow_at then
    return false, remaining, tat - now, allow_at - now
  end
  if cost == 0 then
    return true, remaining, tat - now, 0
  end
  return true, idiv(now - allow_at, interval), new_tat - now, 0, function(ttl_ms)
    redis.call("SET", key, fmt(new_tat), "PX", ttl_ms)
  end
end
