-- units: time in microseconds (integers), amounts and costs in requests.
-- Shared helpers for the algorithm files that follow; the driver (decide.lua) comes last.
-- Globals used on every call, held as upvalues (a global is looked up through the
-- sandbox's tables each time): bound by the driver's first call, since a Function
-- library cannot reach them while it loads.
local call, floor, ceil, min, max, format, find, sub, match
local function bind_globals()
  call, floor, ceil, min, max = redis.call, math.floor, math.ceil, math.min, math.max
  format, find, sub, match = string.format, string.find, string.sub, string.match
end

-- Lua 5.1 numbers are doubles: integer division and modulo are corrected so that they
-- are exact for every integer below 2^53, like Python's // and %.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- Lua's a % b is a - floor(a / b) * b, whose quotient may be one off: corrected here.
local function imod(a, b)
  local r = a % b
  if r < 0 then
    r = r + b
  elseif r >= b then
    r = r - b
  end
  return r
end

local function fmt(n)
  return format("%d", n)
end

-- Conversions of values that repeat from call to call (a window's start, a count, the
-- clock's seconds): each done once and remembered, up to MEMO values, in a Redis
-- Function library's memory (a script forgets them after each call). Kept few: Redis
-- runs a step of Lua's garbage collector every 50 calls, which walks all the library
-- keeps, so thousands of remembered values would cost each call more than they save.
local MEMO = 256
local memo_numbers, memo_texts, memo_size = {}, {}, 0

local function memo_room()
  memo_size = memo_size + 1
  if memo_size > MEMO then memo_numbers, memo_texts, memo_size = {}, {}, 1 end
end

-- tonumber(text), remembered.
local function num(text)
  if not text then return nil end
  local n = memo_numbers[text]
  if n == nil then
    n = tonumber(text)
    memo_room()
    memo_numbers[text] = n
  end
  return n
end

-- fmt(n), remembered.
local function text(n)
  local t = memo_texts[n]
  if t == nil then
    t = format("%d", n)
    memo_room()
    memo_texts[n] = t
  end
  return t
end

local NEVER = -1
local HOUR_US, DAY_US = 3600000000, 86400000000

-- The time the call runs at, in microseconds: the caller's (tests only) where it gives
-- one, else Redis's clock.
local function clock(given)
  if given ~= "" then return tonumber(given) end
  local t = call("TIME")
  return num(t[1]) * 1000000 + tonumber(t[2])
end
local ALGORITHMS = {}
local LEASE = ""  -- set by the driver: the id of the slot a concurrency hit takes
