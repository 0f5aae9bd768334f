-- units: time in microseconds, amounts in requests. Twin of algorithms/concurrency.py.
-- State: sorted set of leases, member = lease id, score = when the lease expires.
-- LEASE (from the driver) names the slot an admitted request takes.
local CONCURRENCY_RETRY_HINT = 1000000
local function concurrency_commit(key, now, ttl_ms, period, nonempty)
  -- Ended leases go; an empty set (every slot given back: the common case) has none.
  if nonempty then call("ZREMRANGEBYSCORE", key, "-inf", fmt(now)) end
  call("ZADD", key, fmt(now + period), LEASE)
  call("PEXPIRE", key, fmt(ttl_ms))
end

ALGORITHMS.concurrency = function(key, now, amount, period, capacity, cost)
  -- The latest lease first: when it has ended (a caller with nothing in flight, the
  -- common case), so have all the others, and they need no counting.
  local latest = call("ZRANGE", key, "-1", "-1", "WITHSCORES")
  local in_flight, reset = 0, 0
  local ends = tonumber(latest[2])
  if ends and ends > now then
    in_flight = call("ZCOUNT", key, "(" .. fmt(now), "+inf")
    reset = ends - now
  end
  if cost > capacity then
    return false, capacity - in_flight, reset, NEVER
  end
  if in_flight + cost > capacity then
    local oldest = call("ZRANGEBYSCORE", key, "(" .. fmt(now), "+inf", "WITHSCORES",
      "LIMIT", 0, 1)
    return false, capacity - in_flight, reset,
      min(tonumber(oldest[2]) - now, CONCURRENCY_RETRY_HINT)
  end
  if cost == 0 then
    return true, capacity - in_flight, reset, 0
  end
  return true, capacity - in_flight - cost, max(reset, period), 0, concurrency_commit,
    period, latest[2] ~= nil
end
