-- units: time in microseconds, amounts in requests.
-- A decision's hits, one argument each: "algorithm amount period capacity cost", the
-- algorithm "gcra+<us>" for a shaped limit (whose admitted requests may wait that long
-- for their turn). The same few come with every request, so each is parsed once and
-- kept in the library (a Redis Function's upvalues outlive the call), up to HIT_CACHE
-- of them (few, as the prelude's MEMO is); then the cache starts over.
local HIT_CACHE = 256
local parsed_hits, parsed_count = {}, 0

-- {algorithm function, amount, period, capacity, cost, longest wait} of one argument,
-- parsed and kept. Callers look in parsed_hits first: a look-up costs less than a call.
-- An algorithm is called with these and the table itself, in whose later slots it may
-- keep what follows from them (gcra.lua: its ticks).
local function parse_hit(arg)
  local name, amount, period, capacity, cost =
    match(arg, "^(%S+) (%d+) (%d+) (%d+) (%d+)$")
  local algorithm, delay = ALGORITHMS[name], 0
  if name and not algorithm then
    local base, held = match(name, "^(.-)%+(%d+)$")
    algorithm, delay = ALGORITHMS[base], tonumber(held)
  end
  if not algorithm then error("ratelimit_mw: not a hit: " .. arg) end
  local hit = {algorithm, tonumber(amount), tonumber(period), tonumber(capacity),
    tonumber(cost), delay}
  if parsed_count >= HIT_CACHE then parsed_hits, parsed_count = {}, 0 end
  parsed_hits[arg] = hit
  parsed_count = parsed_count + 1
  return hit
end

-- The driver's tables, kept from call to call in a Redis Function library (calls run
-- one at a time) so that a decision makes none: a reply for each number of hits, and
-- per hit the commit (a function) and the four values it writes with.
local replies, commits = {}, {}
