-- units: time in microseconds, amounts in requests. Twin of algorithms/sliding_log.py.
-- State: sorted set, one member per admitted unit, scored by its timestamp.
local function sl_commit(key, now, ttl_ms, period, cost)
  redis.call("ZREMRANGEBYSCORE", key, "-inf", fmt(now - period))
  local size = redis.call("ZCARD", key)
  -- In ZADDs of at most 500 members: unpack() takes no more than about 8000 values,
  -- and a commit must not fail halfway (Redis keeps what a failed script wrote).
  local score = fmt(now)
  for first = 1, cost, 500 do
    local args = {}
    for i = first, math.min(cost, first + 499) do
      args[#args + 1] = score
      args[#args + 1] = score .. ":" .. fmt(size + i)
    end
    redis.call("ZADD", key, unpack(args))
  end
  redis.call("PEXPIRE", key, ttl_ms)
end

ALGORITHMS.sliding_log = function(key, now, amount, period, capacity, cost)
  local limit = amount
  local after = "(" .. fmt(now - period)
  local count = redis.call("ZCOUNT", key, after, "+inf")
  local reset = 0
  if count > 0 then
    local newest = redis.call("ZRANGE", key, -1, -1, "WITHSCORES")
    reset = tonumber(newest[2]) + period - now
  end
  if cost > limit then
    return false, limit - count, reset, NEVER
  end
  if count + cost > limit then
    local nth = redis.call("ZRANGEBYSCORE", key, after, "+inf", "WITHSCORES",
      "LIMIT", count + cost - limit - 1, 1)
    return false, limit - count, reset, tonumber(nth[2]) + period - now
  end
  if cost == 0 then
    return true, limit - count, reset, 0
  end
  -- After the clock stepped back, the latest unit still sets the reset.
  return true, limit - count - cost, math.max(reset, period), 0, sl_commit, period, cost
end
