-- units: time in microseconds, amounts in the request's units.
-- Usage history: one counter per hour and per day, each kept for its retention,
-- counting the request's units (its cost), and one per unit it spends (tokens). Its
-- argument (the driver's ARGV[3]) is "hours,days,units", then ";unit=amount" per unit
-- spent; the same few come again and again, so each is parsed once and kept, as hits
-- are (hits.lua), up to HIT_CACHE of them.
local parsed_usage, parsed_usage_count = {}, 0

-- {hours, days, units, {series, amount, ...} of the units spent} of one argument, the
-- amounts kept as strings, as INCRBY takes them.
local function parse_usage(arg)
  local usage = parsed_usage[arg]
  if usage then return usage end
  local h, d, u, spent = match(arg, "^(%d+),(%d+),(%d+)(.*)$")
  local units = {}
  for unit, amount in string.gmatch(spent, ";([%w_-]+)=(%d+)") do
    units[#units + 1] = unit .. ":"
    units[#units + 1] = amount
  end
  usage = {tonumber(h), tonumber(d), u, units}
  if parsed_usage_count >= HIT_CACHE then parsed_usage, parsed_usage_count = {}, 0 end
  parsed_usage[arg] = usage
  parsed_usage_count = parsed_usage_count + 1
  return usage
end

-- Counts `units` (a string) in the hour's and the day's bucket of `series` (a key prefix).
local function count_usage(series, units, now, hours, days)
  local added = num(units)
  local hour, day = idiv(now, HOUR_US), idiv(now, DAY_US)
  local hour_key, day_key = series .. "h:" .. text(hour), series .. "d:" .. text(day)
  -- A bucket's end of life is fixed when it is created: set it then, not per request.
  if call("INCRBY", hour_key, units) == added then
    call("PEXPIRE", hour_key, fmt(ceil(((hour + hours) * HOUR_US - now) / 1000)))
  end
  if call("INCRBY", day_key, units) == added then
    call("PEXPIRE", day_key, fmt(ceil(((day + days) * DAY_US - now) / 1000)))
  end
end

-- Counts a request at `now` in the usage history of the identity whose counter is `key`
-- (the buckets share its tag, the key's start up to its "}:").
local function count_request(key, arg, now)
  local usage = parse_usage(arg)
  local hours, days, spent = usage[1], usage[2], usage[4]
  local buckets = match(key, "^[^}]*}:") .. "u:"
  count_usage(buckets, usage[3], now, hours, days)
  for i = 1, #spent, 2 do
    count_usage(buckets .. spent[i], spent[i + 1], now, hours, days)
  end
end
