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
-- then one argument per hit (see hits.lua): "algorithm amount period capacity cost".
-- Nothing is written unless every hit admits.
-- Reply: {all admitted (1/0), now, then per hit: admitted (1/0), remaining, reset, retry
-- (for an admitted shaped hit: its wait)}.
local SLACK_MS = 1000
local now = clock(ARGV[1])
LEASE = ARGV[2]

local n = #ARGV - 3
local steps = {}
local admitted = true
for i = 1, n do
  local hit = parse_hit(ARGV[3 + i])
  local allowed, remaining, reset, retry, commit =
    hit[1](KEYS[i], now, hit[2], hit[3], hit[4], hit[5], hit[6])
  if not allowed then admitted = false end
  steps[i] = {allowed, remaining, reset, retry, commit, hit}
end

local reply, size = {admitted and 1 or 0, now}, 2
for i = 1, n do
  local s = steps[i]
  if admitted then
    if s[5] then s[5](math.ceil(s[3] / 1000) + SLACK_MS) end
  elseif s[5] then
    -- Report what the admitted limits look like without this request's cost.
    local h = s[6]
    local allowed, remaining, reset, retry = h[1](KEYS[i], now, h[2], h[3], h[4], 0, h[6])
    s = {allowed, remaining, reset, retry}
  end
  reply[size + 1] = s[1] and 1 or 0
  reply[size + 2] = s[2]
  reply[size + 3] = s[3]
  reply[size + 4] = s[4]
  size = size + 4
end

if admitted and ARGV[3] ~= "" then
  -- Usage history: one counter per hour and per day, each kept for its retention,
  -- counting the request's units (its cost), and one per unit it spends (tokens).
  -- ARGV[3] is "hours,days,units", then ";unit=amount" per unit spent.
  local h, d, u, spent = string.match(ARGV[3], "^(%d+),(%d+),(%d+)(.*)$")
  local hours, days = tonumber(h), tonumber(d)
  local hour, day = idiv(now, HOUR_US), idiv(now, DAY_US)
  local buckets = string.match(KEYS[1], "^[^}]*}:") .. "u:"
  local function count(series, units)
    local hour_key, day_key = series .. "h:" .. text(hour), series .. "d:" .. text(day)
    -- A bucket's end of life is fixed when it is created: set it then, not per request.
    if redis.call("INCRBY", hour_key, units) == units then
      redis.call("PEXPIRE", hour_key, math.ceil(((hour + hours) * HOUR_US - now) / 1000))
    end
    if redis.call("INCRBY", day_key, units) == units then
      redis.call("PEXPIRE", day_key, math.ceil(((day + days) * DAY_US - now) / 1000))
    end
  end
  count(buckets, tonumber(u))
  for unit, amount in string.gmatch(spent, ";([%w_-]+)=(%d+)") do
    count(buckets .. unit .. ":", tonumber(amount))
  end
end
return reply
