#!lua name=bench_guarantees_floor
-- units: time in microseconds, amounts in requests. Benchmark only (redis_time.py).
-- The least work a decision needs under ratelimit_mw's guarantees, windows aligned to
-- Redis's clock (TIME) and every limit read before any is written, so that nothing is
-- written unless all admit: only the commands and the arithmetic, with no parsing and
-- no generic driver (each limit's numbers are constants of its function below). The
-- reply is decide.lua's: {all admitted, now, then per limit: admitted, remaining,
-- reset, retry}.
local SLACK_MS = 1000
local HOUR_S, DAY_S = 3600, 86400

-- Redis's clock: microseconds, and whole seconds.
local function clock()
  local t = redis.call("TIME")
  local seconds = tonumber(t[1])
  return seconds * 1000000 + tonumber(t[2]), seconds
end

local function ttl_ms(reset)
  return math.ceil(reset / 1000) + SLACK_MS
end

-- A fixed window's counter is a key per window, named by its start (seconds, which
-- print exactly): GET reads it. The key, its count and the window's reset.
local function window_read(key, now, seconds, period_s)
  local start = seconds - seconds % period_s
  local window = key .. ":" .. start
  return window, tonumber(redis.call("GET", window)) or 0,
    (start + period_s) * 1000000 - now
end

-- The key's life is set once, by the SET that opens the window.
local function window_write(window, count, reset)
  if count == 0 then
    redis.call("SET", window, "1", "PX", ttl_ms(reset))
  else
    redis.call("INCRBY", window, "1")
  end
end

-- The reply's admitted, remaining, reset and retry of one window.
local function window_hit(count, reset, limit, admitted)
  if admitted then return 1, limit - count - 1, reset, 0 end
  return 0, limit - count, reset, count < limit and 0 or reset
end

-- A token bucket's state is one string, "tokens last", written with SET ... PX. The
-- tokens it holds now.
local function bucket_read(key, now, capacity, rate)
  local saved = redis.call("GET", key)
  if not saved then return capacity end
  local space = string.find(saved, " ", 1, true)
  local stored = tonumber(string.sub(saved, 1, space - 1))
  local last = tonumber(string.sub(saved, space + 1))
  return math.min(capacity, stored + math.max(0, now - last) * rate)
end

local function bucket_write(key, now, tokens, capacity, rate)
  local left = tokens - 1
  local state = string.format(left % 1 == 0 and "%d %d" or "%.17g %d", left, now)
  redis.call("SET", key, state, "PX", ttl_ms(math.ceil((capacity - left) / rate)))
end

local function bucket_hit(tokens, capacity, rate, admitted)
  if admitted then
    return 1, math.floor(tokens - 1), math.ceil((capacity - tokens + 1) / rate), 0
  end
  return 0, math.floor(tokens), math.ceil((capacity - tokens) / rate),
    tokens >= 1 and 0 or math.ceil((1 - tokens) / rate)
end

-- The plain floor (INCR, PEXPIRE on the first hit) with Redis's clock read and unused:
-- what TIME alone costs.
local function incr_with_time(keys)
  redis.call("TIME")
  local c = redis.call("INCR", keys[1])
  if c == 1 then redis.call("PEXPIRE", keys[1], 60000) end
  return c
end

-- 1 000 000 a minute in a window aligned to the clock: TIME, GET, SET ... PX or INCRBY.
local function fixed_window(keys)
  local now, seconds = clock()
  local window, count, reset = window_read(keys[1], now, seconds, 60)
  local admitted = count < 1000000
  if admitted then window_write(window, count, reset) end
  return {admitted and 1 or 0, now, window_hit(count, reset, 1000000, admitted)}
end

-- The same with the state ours keeps, a hash {w = window start, c = count}: TIME,
-- HMGET, HSET (and PEXPIRE when the window opens).
local function fixed_window_hash(keys)
  local key, now = keys[1], clock()
  local start = now - now % 60000000
  local saved = redis.call("HMGET", key, "w", "c")
  local opened = tonumber(saved[1]) ~= start
  local count = opened and 0 or tonumber(saved[2])
  local reset = start + 60000000 - now
  if count >= 1000000 then return {0, now, 0, 1000000 - count, reset, reset} end
  if opened then
    redis.call("HSET", key, "w", string.format("%d", start), "c", "1")
    redis.call("PEXPIRE", key, ttl_ms(reset))
  else
    redis.call("HSET", key, "c", count + 1)
  end
  return {1, now, 1, 1000000 - count - 1, reset, 0}
end

-- One limit alone needs no read before its write: INCRBY first (PEXPIRE when it
-- opens the window), taken back with DECRBY when over the limit. TIME still aligns it.
local function fixed_window_write_first(keys)
  local now, seconds = clock()
  local start = seconds - seconds % 60
  local window = keys[1] .. ":" .. start
  local count = redis.call("INCRBY", window, "1")
  local reset = (start + 60) * 1000000 - now
  if count == 1 then redis.call("PEXPIRE", window, ttl_ms(reset)) end
  if count > 1000000 then
    redis.call("DECRBY", window, "1")
    return {0, now, 0, 1000000 - count + 1, reset, reset}
  end
  return {1, now, 1, 1000000 - count, reset, 0}
end

-- 1 000 000 a minute, a burst of as many: TIME, GET, SET ... PX.
local function token_bucket(keys)
  local now = clock()
  local rate = 1000000 / 60000000
  local tokens = bucket_read(keys[1], now, 1000000, rate)
  local admitted = tokens >= 1
  if admitted then bucket_write(keys[1], now, tokens, 1000000, rate) end
  return {admitted and 1 or 0, now, bucket_hit(tokens, 1000000, rate, admitted)}
end

-- 1 000 000 a minute, a burst of as many: the state is the theoretical arrival time
-- (TAT), one emission interval (60 µs) later per request. TIME, GET, SET ... PX.
local function gcra(keys)
  local key, now = keys[1], clock()
  local interval, tau = 60, 60 * 1000000
  local tat = tonumber(redis.call("GET", key)) or now
  if tat < now then tat = now end
  local ahead = tat + interval - now
  if ahead > tau then
    return {0, now, 0, math.floor((tau - tat + now) / interval), tat - now, ahead - tau}
  end
  redis.call("SET", key, string.format("%d", now + ahead), "PX", ttl_ms(ahead))
  return {1, now, 1, math.floor((tau - ahead) / interval), ahead, 0}
end

-- 1 000 000 a minute, exact: a sorted set, one member per admitted request scored by
-- its time. ZCOUNT reads the requests in the window; an admitted one drops those that
-- left it (the set holds no more than the limit), adds itself and sets the key's life.
-- TIME, ZCOUNT, ZREMRANGEBYSCORE, ZADD, PEXPIRE.
local function sliding_log(keys)
  local key, now = keys[1], clock()
  local edge = string.format("%d", now - 60000000)
  local count = redis.call("ZCOUNT", key, "(" .. edge, "+inf")
  if count >= 1000000 then  -- the reset from the newest, the retry from the oldest kept
    local newest = redis.call("ZRANGE", key, "-1", "-1", "WITHSCORES")
    local nth = redis.call("ZRANGEBYSCORE", key, "(" .. edge, "+inf", "WITHSCORES",
      "LIMIT", count - 1000000, 1)
    return {0, now, 0, 1000000 - count, tonumber(newest[2]) + 60000000 - now,
      tonumber(nth[2]) + 60000000 - now}
  end
  redis.call("ZREMRANGEBYSCORE", key, "-inf", edge)
  local score = string.format("%d", now)
  redis.call("ZADD", key, score, score .. ":" .. (count + 1))
  redis.call("PEXPIRE", key, "61000")
  return {1, now, 1, 1000000 - count - 1, 60000000, 0}
end

-- The same, the newest request read first as ours does: when none is in the window
-- (an empty set, a caller not seen for a period) no ZCOUNT, and for an empty set no
-- ZREMRANGEBYSCORE. TIME, ZRANGE, (ZCOUNT, ZREMRANGEBYSCORE,) ZADD, PEXPIRE.
local function sliding_log_newest_first(keys)
  local key, now = keys[1], clock()
  local edge = string.format("%d", now - 60000000)
  local newest = redis.call("ZRANGE", key, "-1", "-1", "WITHSCORES")
  local count, latest = 0, tonumber(newest[2])
  if latest and latest > now - 60000000 then
    count = redis.call("ZCOUNT", key, "(" .. edge, "+inf")
  end
  if count >= 1000000 then
    local nth = redis.call("ZRANGEBYSCORE", key, "(" .. edge, "+inf", "WITHSCORES",
      "LIMIT", count - 1000000, 1)
    return {0, now, 0, 1000000 - count, latest + 60000000 - now,
      tonumber(nth[2]) + 60000000 - now}
  end
  if latest then redis.call("ZREMRANGEBYSCORE", key, "-inf", edge) end
  local score = string.format("%d", now)
  redis.call("ZADD", key, score, score .. ":" .. (count + 1))
  redis.call("PEXPIRE", key, "61000")
  return {1, now, 1, 1000000 - count - 1, 60000000, 0}
end

-- 1 000 000 a minute, the previous window's count weighted by its share still inside
-- the sliding window. A key per window named by its start, as the fixed window's: the
-- current and the previous read with one MGET, the current written with SET ... PX
-- when it opens (it lives to the end of the next window, where it is the previous) or
-- INCRBY. TIME, MGET, SET ... PX or INCRBY.
local function sliding_window(keys)
  local now, seconds = clock()
  local start = seconds - seconds % 60
  local window = keys[1] .. ":" .. start
  local counts = redis.call("MGET", window, keys[1] .. ":" .. (start - 60))
  local current, previous = tonumber(counts[1]) or 0, tonumber(counts[2]) or 0
  local start_us = start * 1000000
  local used = previous * ((60000000 - (now - start_us)) / 60000000) + current
  if used + 1 > 1000000 then  -- the retry: when the weighted count first leaves room
    local at
    if current + 1 <= 1000000 then
      at = start_us + math.ceil(60000000 - (1000000 - current - 1) / previous * 60000000)
    else
      at = start_us + 60000000 + math.ceil(60000000 - 999999 / current * 60000000)
    end
    local reset = current > 0 and start_us + 120000000 - now or start_us + 60000000 - now
    return {0, now, 0, math.floor(1000000 - used), reset, math.max(at, now + 1) - now}
  end
  local reset = start_us + 120000000 - now
  if current == 0 then
    redis.call("SET", window, "1", "PX", ttl_ms(reset))
  else
    redis.call("INCRBY", window, "1")
  end
  return {1, now, 1, math.floor(1000000 - used - 1), reset, 0}
end

-- A bucket of 1 000 a minute, 500 000 a day, 100 000 an hour: all three read, then
-- all three written if all admit.
local function three_limits(keys)
  local now, seconds = clock()
  local rate = 1000 / 60000000
  local tokens = bucket_read(keys[1], now, 1000, rate)
  local day, day_count, day_reset = window_read(keys[2], now, seconds, DAY_S)
  local hour, hour_count, hour_reset = window_read(keys[3], now, seconds, HOUR_S)
  local admitted = tokens >= 1 and day_count < 500000 and hour_count < 100000
  if admitted then
    bucket_write(keys[1], now, tokens, 1000, rate)
    window_write(day, day_count, day_reset)
    window_write(hour, hour_count, hour_reset)
  end
  local a1, r1, t1, w1 = bucket_hit(tokens, 1000, rate, admitted)
  local a2, r2, t2, w2 = window_hit(day_count, day_reset, 500000, admitted)
  return {admitted and 1 or 0, now, a1, r1, t1, w1, a2, r2, t2, w2,
    window_hit(hour_count, hour_reset, 100000, admitted)}
end

-- A usage bucket (hour or day) counts the request; its life is set when it opens.
local function count_usage(key, seconds, period_s, kept)
  local start = seconds - seconds % period_s
  local bucket = key .. start
  if redis.call("INCRBY", bucket, "1") == 1 then
    redis.call("PEXPIRE", bucket, (start + kept * period_s - seconds) * 1000)
  end
end

-- The example app's pro tier: a bucket of 1 000 a minute with a burst of 2 000,
-- 500 000 a day, 50 slots in flight (ARGV[1] the slot's lease, 30 s), then the usage
-- history (hour and day buckets, kept 7 and 90 days, keys after the first one's).
local function tier(keys, args)
  local now, seconds = clock()
  local rate = 1000 / 60000000
  local tokens = bucket_read(keys[1], now, 2000, rate)
  local day, day_count, day_reset = window_read(keys[2], now, seconds, DAY_S)
  local latest = redis.call("ZRANGE", keys[3], "-1", "-1", "WITHSCORES")
  local in_flight, ends = 0, tonumber(latest[2])
  if ends and ends > now then
    in_flight = redis.call("ZCOUNT", keys[3], "(" .. string.format("%d", now), "+inf")
  end
  local admitted = tokens >= 1 and day_count < 500000 and in_flight < 50
  if admitted then
    bucket_write(keys[1], now, tokens, 2000, rate)
    window_write(day, day_count, day_reset)
    if ends then redis.call("ZREMRANGEBYSCORE", keys[3], "-inf", string.format("%d", now)) end
    redis.call("ZADD", keys[3], now + 30000000, args[1])
    redis.call("PEXPIRE", keys[3], 30000 + SLACK_MS)
    count_usage(keys[1] .. ":u:h:", seconds, HOUR_S, 7 * 24)
    count_usage(keys[1] .. ":u:d:", seconds, DAY_S, 90)
  end
  local a1, r1, t1, w1 = bucket_hit(tokens, 2000, rate, admitted)
  local a2, r2, t2, w2 = window_hit(day_count, day_reset, 500000, admitted)
  return {admitted and 1 or 0, now, a1, r1, t1, w1, a2, r2, t2, w2,
    admitted and 1 or 0, 50 - in_flight - (admitted and 1 or 0), 30000000, 0}
end

redis.register_function("floor_incr_with_time", incr_with_time)
redis.register_function("floor_fixed_window", fixed_window)
redis.register_function("floor_fixed_window_hash", fixed_window_hash)
redis.register_function("floor_fixed_window_write_first", fixed_window_write_first)
redis.register_function("floor_token_bucket", token_bucket)
redis.register_function("floor_gcra", gcra)
redis.register_function("floor_sliding_log", sliding_log)
redis.register_function("floor_sliding_log_newest_first", sliding_log_newest_first)
redis.register_function("floor_sliding_window", sliding_window)
redis.register_function("floor_three_limits", three_limits)
redis.register_function("floor_tier", tier)
