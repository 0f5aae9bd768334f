"""Calendar month: a fixed window from the first of a UTC month to the first of the next.

For monthly quotas that reset on the 1st, as plans are sold. State as the fixed
window's. Dates come from integer day arithmetic (H. Hinnant's ``civil_from_days``),
the same steps as the Lua twin.
"""

from __future__ import annotations

from typing import Final

from .base import RawStep
from .fixed_window import FixedWindowState, in_window, settle_in

DAY_US: Final = 86_400_000_000


def civil_from_days(days: int) -> tuple[int, int, int]:
    """(year, month, day) of the day ``days`` after 1970-01-01."""
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (1 if month <= 2 else 0), month, day


def days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to ``year-month-day``."""
    year -= 1 if month <= 2 else 0
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def month_bounds(now: int) -> tuple[int, int]:
    """The first microsecond of this UTC month and of the next one."""
    days = now // DAY_US
    year, month, day = civil_from_days(days)
    start = days - day + 1
    end = days_from_civil(year + 1, 1, 1) if month == 12 else days_from_civil(year, month + 1, 1)
    return start * DAY_US, end * DAY_US


def decide(
    state: FixedWindowState | None, now: int, limit: int, period: int, capacity: int, cost: int,
) -> RawStep:
    """Admit ``cost`` units if this calendar month has room (``period`` is ignored)."""
    start, end = month_bounds(now)
    return in_window(state, now, start, end, limit, cost)


def settle(state: FixedWindowState | None, now: int, at: int,
           delta: int) -> FixedWindowState | None:
    """The state with ``delta`` more units charged at ``at``, in ``at``'s month."""
    start, end = month_bounds(at)
    return settle_in(state, now, start, end, delta)
