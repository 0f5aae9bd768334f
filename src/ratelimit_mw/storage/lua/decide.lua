-- units: time in microseconds, amounts in requests.
-- Decides every limit of one request at once: KEYS[i] is the counter of hit i;
-- ARGV[1] is empty (use Redis's clock) or a time in microseconds (tests only: lets the
-- differential tests drive Redis on simulated time); then five values per hit:
-- algorithm, amount, period, capacity, cost. Nothing is written unless every hit admits.
-- Reply: {all admitted (1/0), then per hit: admitted (1/0), remaining, reset, retry}.
local SLACK_MS = 1000
local now
if ARGV[1] ~= "" then
  now = tonumber(ARGV[1])
else
  local t = redis.call("TIME")
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local n = #KEYS
local steps = {}
local admitted = true
for i = 1, n do
  local j = 2 + (i - 1) * 5
  local algorithm = ALGORITHMS[ARGV[j]]
  local amount, period = tonumber(ARGV[j + 1]), tonumber(ARGV[j + 2])
  local capacity, cost = tonumber(ARGV[j + 3]), tonumber(ARGV[j + 4])
  local allowed, remaining, reset, retry, commit =
    algorithm(KEYS[i], now, amount, period, capacity, cost)
  if not allowed then admitted = false end
  steps[i] = {allowed, remaining, reset, retry, commit, algorithm, amount, period, capacity}
end

local reply = {admitted and 1 or 0}
for i = 1, n do
  local s = steps[i]
  if admitted then
    if s[5] then s[5](math.ceil(s[3] / 1000) + SLACK_MS) end
  elseif s[5] then
    -- Report what the admitted limits look like without this request's cost.
    local allowed, remaining, reset, retry = s[6](KEYS[i], now, s[7], s[8], s[9], 0)
    s = {allowed, remaining, reset, retry}
  end
  reply[#reply + 1] = s[1] and 1 or 0
  reply[#reply + 1] = s[2]
  reply[#reply + 1] = s[3]
  reply[#reply + 1] = s[4]
end
return reply
