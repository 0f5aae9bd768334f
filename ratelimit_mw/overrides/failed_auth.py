"""Failed authentications of the admin API, limited per client address.

Each call reserves one failure of its client address before the token is checked (so a
burst of guesses can't overshoot the limit), and a right token takes it back: a
count-failures limit on the library's own reserve-then-settle. A client over the limit
is refused with 429 before its token is looked at; a right token is never refused
for failures of other addresses. Every bad token is logged with the client address.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple

from starlette.requests import Request

from ..decision import Adjustment
from ..hits import Hit
from ..limiter import Limiter
from ..limits import Limit

__all__ = ["AuthGate", "FailedAuth"]

_log = logging.getLogger("ratelimit_mw.admin")
_SCOPE = "admin authentication"


class AuthGate(NamedTuple):
    """One call's way through: refused (``retry_after`` seconds), or let through with
    the failure it reserved (``taken``: None when the storage could not decide)."""

    refused: bool
    retry_after: int
    taken: Adjustment | None


class FailedAuth:
    """Counts failed admin authentications per client address against ``rate``."""

    __slots__ = ("hit",)

    def __init__(self, rate: str) -> None:
        self.hit = Hit(Limit(rate, "fixed_window", name="admin-auth-failures",
                             count="failures"), 1, _SCOPE)

    async def enter(self, request: Request, limiter: Limiter) -> AuthGate:
        """Reserve one failure of the request's client address, or refuse it."""
        key = limiter.identity.client_ip(request.scope)
        verdict, _ = await limiter.guarded.decide(key, (self.hit,))
        if verdict is None:  # the storage can't count: the token alone decides
            return AuthGate(False, 0, None)
        if not verdict.allowed:
            return AuthGate(True, max(1, math.ceil(verdict.retry_after)), None)
        at = verdict.at if verdict.at is not None else limiter.clock()
        return AuthGate(False, 0, Adjustment(key, self.hit, -1, at))

    @staticmethod
    async def passed(gate: AuthGate, limiter: Limiter) -> None:
        """The token was right: take the reserved failure back (a storage that fails
        meanwhile leaves it counted)."""
        taken = gate.taken
        if taken is not None:
            try:
                await limiter.read(lambda: limiter.storage.settle([taken]))
            except Exception as exc:
                _log.warning("ratelimit_mw admin: couldn't take back a reserved failure of "
                             "%s (%s)", taken.key, exc)

    @staticmethod
    def failed(request: Request) -> None:
        """Log a bad token, with its client's address."""
        client = request.client.host if request.client else "-"
        _log.warning("ratelimit_mw admin: bad or missing token from %s for %s %s", client,
                     request.method, request.url.path,
                     extra={"ratelimit": {"event": "admin_auth_failed", "client": client}})
