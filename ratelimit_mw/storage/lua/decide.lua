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
if not call then bind_globals() end
local now = clock(ARGV[1])
LEASE = ARGV[2]

-- Every hit is decided (its counter read) before any commits: all or nothing. An
-- admitted hit's commit is a function of the library and up to four values.
local n = #ARGV - 3
local reply = replies[n]
if not reply then
  reply = {}
  replies[n] = reply
end

-- One hit (most decisions): committed at once when admitted; denied, it has no commit.
if n == 1 then
  local hit = parsed_hits[ARGV[4]] or parse_hit(ARGV[4])
  local allowed, remaining, reset, retry, commit, a, b, c, d =
    hit[1](KEYS[1], now, hit[2], hit[3], hit[4], hit[5], hit[6], hit)
  local admits = 0
  if allowed then
    if commit then commit(KEYS[1], now, ceil(reset / 1000) + SLACK_MS, a, b, c, d) end
    if ARGV[3] ~= "" then count_request(KEYS[1], ARGV[3], now) end
    admits = 1
  end
  reply[1], reply[2], reply[3], reply[4], reply[5], reply[6] =
    admits, now, admits, remaining, reset, retry
  return reply
end

local admitted = true
for i = 1, n do
  local hit = parsed_hits[ARGV[3 + i]] or parse_hit(ARGV[3 + i])
  local allowed, remaining, reset, retry, commit, a, b, c, d =
    hit[1](KEYS[i], now, hit[2], hit[3], hit[4], hit[5], hit[6], hit)
  local r, s = 4 * i - 1, 5 * i - 4
  if allowed then reply[r] = 1 else reply[r], admitted = 0, false end
  reply[r + 1], reply[r + 2], reply[r + 3] = remaining, reset, retry
  commits[s], commits[s + 1], commits[s + 2], commits[s + 3], commits[s + 4] =
    commit or false, a, b, c, d
end
reply[1], reply[2] = admitted and 1 or 0, now

for i = 1, n do
  local s = 5 * i - 4
  local commit = commits[s]
  if commit then
    local r = 4 * i - 1
    if admitted then
      commit(KEYS[i], now, ceil(reply[r + 2] / 1000) + SLACK_MS,
        commits[s + 1], commits[s + 2], commits[s + 3], commits[s + 4])
    else
      -- Report what the admitted limits look like without this request's cost.
      local h = parsed_hits[ARGV[3 + i]] or parse_hit(ARGV[3 + i])
      local allowed, remaining, reset, retry =
        h[1](KEYS[i], now, h[2], h[3], h[4], 0, h[6], h)
      reply[r], reply[r + 1], reply[r + 2], reply[r + 3] =
        allowed and 1 or 0, remaining, reset, retry
    end
  end
end

if admitted and ARGV[3] ~= "" then count_request(KEYS[1], ARGV[3], now) end
return reply
