-- units: time in microseconds, amounts in requests. Twin of algorithms/calendar_month.py.
-- A fixed window over the UTC calendar month; state as the fixed window's.

local function civil_from_days(days)
  local z = days + 719468
  local era = idiv(z, 146097)
  local doe = z - era * 146097
  local yoe = idiv(doe - idiv(doe, 1460) + idiv(doe, 36524) - idiv(doe, 146096), 365)
  local doy = doe - (365 * yoe + idiv(yoe, 4) - idiv(yoe, 100))
  local mp = idiv(5 * doy + 2, 153)
  local day = doy - idiv(153 * mp + 2, 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400
  if month <= 2 then year = year + 1 end
  return year, month, day
end

local function days_from_civil(year, month, day)
  if month <= 2 then year = year - 1 end
  local era = idiv(year, 400)
  local yoe = year - era * 400
  local m = month > 2 and month - 3 or month + 9
  local doy = idiv(153 * m + 2, 5) + day - 1
  return era * 146097 + yoe * 365 + idiv(yoe, 4) - idiv(yoe, 100) + doy - 719468
end

-- The month of t: its first and its end, in microseconds. The last day's answer is
-- remembered (in a Redis Function library, from call to call).
local cm_day, cm_start, cm_finish

local function cm_bounds(t)
  local days = idiv(t, DAY_US)
  if days == cm_day then return cm_start, cm_finish end
  local year, month, day = civil_from_days(days)
  local start = days - day + 1
  local finish
  if month == 12 then
    finish = days_from_civil(year + 1, 1, 1)
  else
    finish = days_from_civil(year, month + 1, 1)
  end
  cm_day, cm_start, cm_finish = days, start * DAY_US, finish * DAY_US
  return cm_start, cm_finish
end

ALGORITHMS.calendar_month = function(key, now, amount, period, capacity, cost)
  local start, finish = cm_bounds(now)
  return fw_in_window(key, now, start, finish, amount, cost)
end
