-- units: time in microseconds (integers), amounts and costs in requests.
-- Shared helpers for the algorithm files that follow; the driver (decide.lua) comes last.
-- Lua 5.1 numbers are doubles: integer division and modulo are corrected so that they
-- are exact for every integer below 2^53, like Python's // and %.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

local function imod(a, b)
  return a - idiv(a, b) * b
end

local function fmt(n)
  return string.format("%d", n)
end

local NEVER = -1
local ALGORITHMS = {}
local LEASE = ""  -- set by the driver: the id of the slot a concurrency hit takes
