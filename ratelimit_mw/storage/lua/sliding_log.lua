-- units: time in microseconds, amounts in requests. Twin of algorithms/sliding_log.py.
-- State: sorted set, one member per admitted unit, scored by its timestamp.
local function sl_commit(key, now, ttl_ms, period, cost, count, nonempty)
  -- Units that left the window go (an empty set has none); the `count` in it stay.
  if nonempty then call("ZREMRANGEBYSCORE", key, "-inf", fmt(now - period)) end
  local score = fmt(now)
  if cost == 1 then  -- one member (the common case): no table to unpack
    call("ZADD", key, score, score .. ":" .. text(count + 1))
  else
    -- In ZADDs of at most 500 members: unpack() takes no more than about 8000 values,
    -- and a commit must not fail halfway (Redis keeps what a failed script wrote).
    for first = 1, cost, 500 do
      local args = {}
      for i = first, min(cost, first + 499) do
        args[#args + 1] = score
        args[#args + 1] = score .. ":" .. text(count + i)
      end
      call("ZADD", key, unpack(args))
    end
  end
  call("PEXPIRE", key, fmt(ttl_ms))
end

-- The newest unit's time, or nil for an empty set. Every member is named "<its score>:..."
-- (sl_commit, settle.lua), so the name says it: asked WITHSCORES, Redis would write the
-- score out as a double ("%.17g"), for more than the rest of a returning caller's read.
local function sl_latest(key)
  local member = call("ZRANGE", key, "-1", "-1")[1]
  if not member then return nil end
  local score = match(member, "^(%-?%d+):")
  return tonumber(score or call("ZSCORE", key, member))
end

ALGORITHMS.sliding_log = function(key, now, amount, period, capacity, cost)
  local limit = amount
  -- The newest unit first: when it has left the window (or the set is empty), so have
  -- all the others, and they need no counting.
  local latest = sl_latest(key)
  local count, reset = 0, 0
  if latest and latest > now - period then
    count = call("ZCOUNT", key, "(" .. fmt(now - period), "+inf")
    reset = latest + period - now
  end
  if cost > limit then
    return false, limit - count, reset, NEVER
  end
  if count + cost > limit then
    local nth = call("ZRANGEBYSCORE", key, "(" .. fmt(now - period), "+inf",
      "WITHSCORES", "LIMIT", count + cost - limit - 1, 1)
    return false, limit - count, reset, tonumber(nth[2]) + period - now
  end
  if cost == 0 then
    return true, limit - count, reset, 0
  end
  -- After the clock stepped back, the latest unit still sets the reset.
  return true, limit - count - cost, max(reset, period), 0, sl_commit, period, cost,
    count, latest ~= nil
end
