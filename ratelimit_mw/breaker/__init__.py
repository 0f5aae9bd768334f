"""A circuit breaker for async calls: closed, open and half-open, after resilience4j.

Use it around a flaky dependency (``await breaker.call(fn)``, ``@breaker``,
``async with breaker:``) or, without wrapping a function, through
``breaker.try_acquire()`` and the `Permit` it returns. ``SharedCircuitBreaker`` keeps
its opening in Redis for every worker; ``breaker_dependency``, ``circuit_open_handler``
and ``BreakerGuard`` put a breaker in front of FastAPI routes or an ASGI app. Those load
Starlette or redis-py on first use, so the retrying client imports this package alone.
"""

from typing import TYPE_CHECKING

from ..lazy import lazy_names as _lazy_names
from .circuit_breaker import CircuitBreaker
from .core import Permit
from .gate import Gate
from .state import BreakerWatcher, CircuitOpenError, CircuitState

if TYPE_CHECKING:
    from .guard import BreakerGuard, CircuitRefusal, breaker_dependency, circuit_open_handler
    from .shared import SharedCircuitBreaker

__all__ = [
    "BreakerGuard",
    "BreakerWatcher",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitRefusal",
    "CircuitState",
    "Gate",
    "Permit",
    "SharedCircuitBreaker",
    "breaker_dependency",
    "circuit_open_handler",
]

_HOMES = {
    "BreakerGuard": ".guard",
    "CircuitRefusal": ".guard",
    "SharedCircuitBreaker": ".shared",
    "breaker_dependency": ".guard",
    "circuit_open_handler": ".guard",
}
"""The names that load Starlette or redis-py on first use, and their modules."""
__getattr__, __dir__ = _lazy_names(__name__, _HOMES)
