-- units: time in microseconds, amounts in the limit's units.
-- Settles reserved charges after their responses: twin of each algorithm's ``settle``
-- (algorithms/*.py). Follows the algorithm files, whose helpers it uses.
-- KEYS[i] is the counter of adjustment i (one identity's keys: one hash slot).
-- ARGV[1] is empty (Redis's clock) or a time in microseconds (tests only); then seven
-- values per adjustment: algorithm, amount, period, capacity, delta, the time its
-- request was decided, and the unit whose usage history moves too ("" for none: the
-- requests' history counts requests, and a request's unit moves once).
-- Reply: how many counters changed.
local SETTLE_SLACK_MS = 1000
local SETTLE = {}

-- The key lives at least until `ends` (a time): a debt outlives the reservation.
local function keep_until(key, now, ends)
  local ttl = ceil((ends - now) / 1000) + SETTLE_SLACK_MS
  if call("PTTL", key) < ttl then call("PEXPIRE", key, fmt(ttl)) end
end

local function fw_settle(key, now, start, finish, delta)
  local saved = call("HMGET", key, "w", "c")
  if saved[1] then
    if tonumber(saved[1]) ~= start then return false end
    call("HSET", key, "c", fmt(max(0, tonumber(saved[2]) + delta)))
    return true
  end
  if now >= finish or delta <= 0 then return false end  -- nothing reserved, nothing due
  call("HSET", key, "w", fmt(start), "c", fmt(delta))
  keep_until(key, now, finish)
  return true
end

SETTLE.fixed_window = function(key, now, at, amount, period, capacity, delta)
  local start = at - imod(at, period)
  return fw_settle(key, now, start, start + period, delta)
end

SETTLE.calendar_month = function(key, now, at, amount, period, capacity, delta)
  local start, finish = cm_bounds(at)
  return fw_settle(key, now, start, finish, delta)
end

SETTLE.sliding_window = function(key, now, at, amount, period, capacity, delta)
  local start = at - imod(at, period)
  local saved = call("HMGET", key, "w", "c", "p")
  local w = tonumber(saved[1])
  if not w then
    if delta <= 0 or now >= start + 2 * period then return false end
    if now < start + period then
      call("HSET", key, "w", fmt(start), "c", fmt(delta), "p", "0")
    else
      call("HSET", key, "w", fmt(start + period), "c", "0", "p", fmt(delta))
    end
    keep_until(key, now, start + 2 * period)
    return true
  end
  if w == start then
    call("HSET", key, "c", fmt(max(0, tonumber(saved[2]) + delta)))
  elseif w == start + period then
    call("HSET", key, "p", fmt(max(0, tonumber(saved[3]) + delta)))
  else
    return false
  end
  return true
end

SETTLE.sliding_log = function(key, now, at, amount, period, capacity, delta)
  if at <= now - period then return false end
  local score = fmt(at)
  if delta < 0 then
    local taken = call("ZRANGEBYSCORE", key, score, score, "LIMIT", 0, -delta)
    if #taken == 0 then return false end
    for first = 1, #taken, 500 do
      call("ZREM", key, unpack(taken, first, min(#taken, first + 499)))
    end
    return true
  end
  -- Members of their own ("s" and the settling time), apart from the decisions'.
  local size, tag = call("ZCARD", key), score .. ":s" .. fmt(now) .. ":"
  for first = 1, delta, 500 do
    local args = {}
    for i = first, min(delta, first + 499) do
      args[#args + 1] = score
      args[#args + 1] = tag .. fmt(size + i)
    end
    call("ZADD", key, unpack(args))
  end
  keep_until(key, now, at + period)
  return true
end

SETTLE.token_bucket = function(key, now, at, amount, period, capacity, delta)
  local rate = amount / period
  local saved = call("HMGET", key, "t", "l")
  local stored, last = tonumber(saved[1]), tonumber(saved[2])
  if stored and tb_available(stored, last, now, capacity, rate) >= capacity then
    stored = nil  -- refilled by now: a full bucket, as if the key had gone
  end
  local tokens
  if stored then
    tokens, last = min(capacity, stored - delta), last
  elseif delta > 0 then  -- a full bucket: only a debt changes it, from now
    tokens, last = capacity - delta, now
  else
    return false
  end
  call("HSET", key, "t", format("%.17g", tokens), "l", fmt(last))
  keep_until(key, now, last + ceil((capacity - tokens) / rate))
  return true
end

SETTLE.gcra = function(key, now, at, amount, period, capacity, delta)
  local per_us, interval = gcra_ticks(amount, period, capacity)
  -- Ticks past now: a TAT already passed is an empty bucket, as when deciding.
  local ahead = delta * interval
  local stored = call("GET", key)
  if stored then
    local dot = find(stored, ".", 1, true)
    local us, part = tonumber(stored), 0
    if dot then
      us, part = tonumber(sub(stored, 1, dot - 1)), tonumber(sub(stored, dot + 1))
    end
    if us >= now then ahead = ahead + (us - now) * per_us + part end
  elseif delta <= 0 then
    return false
  end
  if ahead <= 0 then
    call("DEL", key)
  else
    local us = now + idiv(ahead, per_us)
    call("SET", key, fmt(us) .. "." .. fmt(imod(ahead, per_us)),
      "PX", fmt(ceil((us - now) / 1000) + SETTLE_SLACK_MS))
  end
  return true
end

if not call then bind_globals() end
local now = clock(ARGV[1])

-- The hour and day buckets of the unit's usage history that counted the request at
-- `at`, moved by delta (never below 0); none where the history is off.
local function settle_usage(key, unit, at, delta)
  local series = match(key, "^[^}]*}:") .. "u:" .. unit .. ":"
  for _, bucket in ipairs({"h:" .. fmt(idiv(at, HOUR_US)), "d:" .. fmt(idiv(at, DAY_US))}) do
    local counted = call("GET", series .. bucket)
    if counted then
      call("SET", series .. bucket, fmt(max(0, tonumber(counted) + delta)),
        "KEEPTTL")
    end
  end
end

local changed = 0
for i = 1, #KEYS do
  local j = 2 + (i - 1) * 7
  local settle = SETTLE[ARGV[j]]
  local at, delta = tonumber(ARGV[j + 5]), tonumber(ARGV[j + 4])
  if settle and settle(KEYS[i], now, at, tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2]),
      tonumber(ARGV[j + 3]), delta) then
    changed = changed + 1
  end
  if ARGV[j + 6] ~= "" then settle_usage(KEYS[i], ARGV[j + 6], at, delta) end
end
return changed
