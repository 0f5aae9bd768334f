-- units: time in microseconds, amounts in requests.
-- Decides every limit of one request at once: KEYS[i] is the counter of hit i (with
-- usage and no hit, the one key is the usage buckets' prefix). The usage buckets are
-- not declared: they share the identity's tag (the keys' start up to its "}:"), so
-- they are in the same slot; declared, a bucket not yet made would fail the script
-- with TRYAGAIN while a Cluster slot migrates.
-- ARGV[1] is empty (use Redis's clock) or a time in microseconds (tests only: lets the
-- differential tests drive Redis on simulated time); ARGV[2] the lease id a
-- concurrency hit takes; ARGV[3] the usage "hours,days,units" (then ";unit=amount" per
-- other unit the request spends) or empty (no usage);
-- then five values per hit: algorithm ("gcra+<us>" for a shaped limit, whose admitted
-- requests may wait that long for their turn), amount, period, capacity, cost.
-- Nothing is written unless every hit admits.
-- Reply: {all admitted (1/0), now, then per hit: admitted (1/0), remaining, reset, retry
-- (for an admitted shaped hit: its wait)}.
local SLACK_MS = 1000
local HOUR, DAY = 3600000000, 86400000000
local now
if ARGV[1] ~= "" then
  now = tonumber(ARGV[1])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
LEASE = ARGV[2]

local n = (#ARGV - 3) / 5
local steps = {}
local admitted = true
for i = 1, n do
  local j = 4 + (i - 1) * 5
  local algorithm, delay = ALGORITHMS[ARGV[j]], 0
  if not algorithm then  -- a shaped limit: "gcra+<its longest wait in microseconds>"
    local name, held = string.match(ARGV[j], "^(.-)%+(%d+)$")
    algorithm, delay = ALGORITHMS[name], tonumber(held)
  end
  local amount, period = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local capacity, cost = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local allowed, remaining, reset, retry, commit =
    algorithm(KEYS[i], now, amount, period, capacity, cost, delay)
  if not allowed then admitted = false end
  steps[i] = {allowed, remaining, reset, retry, commit, algorithm, amount, period, capacity,
    delay}
end

local reply = {admitted and 1 or 0, now}
for i = 1, n do
  local s = steps[i]
  if admitted then
    if s[5] then s[5](math.ceil(s[3] / 1000) + SLACK_MS) end
  elseif s[5] then
    -- Report what the admitted limits look like without this request's cost.
    local allowed, remaining, reset, retry = s[6](KEYS[i], now, s[7], s[8], s[9], 0, s[10])
    s = {allowed, remaining, reset, retry}
  end
  reply[#reply + 1] = s[1] and 1 or 0
  reply[#reply + 1] = s[2]
  reply[#reply + 1] = s[3]
  reply[#reply + 1] = s[4]
end

if admitted and ARGV[3] ~= "" then
  -- Usage history: one counter per hour and per day, each kept for its retention,
  -- counting the request's units (its cost), and one per unit it spends (tokens).
  -- ARGV[3] is "hours,days,units", then ";unit=amount" per unit spent.
  local h, d, u, spent = string.match(ARGV[3], "^(%d+),(%d+),(%d+)(.*)$")
  local hours, days = tonumber(h), tonumber(d)
  local hour, day = idiv(now, HOUR), idiv(now, DAY)
  local buckets = string.match(KEYS[1], "^[^}]*}:") .. "u:"
  local function count(series, units)
    local hour_key, day_key = series .. "h:" .. fmt(hour), series .. "d:" .. fmt(day)
    -- A bucket's end of life is fixed when it is created: set it then, not per request.
    if redis.call("INCRBY", hour_key, units) == units then
      redis.call("PEXPIRE", hour_key, math.ceil(((hour + hours) * HOUR - now) / 1000))
    end
    if redis.call("INCRBY", day_key, units) == units then
      redis.call("PEXPIRE", day_key, math.ceil(((day + days) * DAY - now) / 1000))
    end
  end
  count(buckets, tonumber(u))
  for unit, amount in string.gmatch(spent, ";([%w_-]+)=(%d+)") do
    count(buckets .. unit .. ":", tonumber(amount))
  end
end
return reply
