"""A circuit breaker for async calls: closed, open and half-open, after resilience4j.

Use it around a flaky dependency (``await breaker.call(fn)``, ``@breaker``,
``async with breaker:``) or, without wrapping a function, through
``breaker.try_acquire()`` and the `Permit` it returns.
"""

from ._breaker import Permit
from ._gate import Gate
from ._public import CircuitBreaker
from ._state import BreakerWatcher, CircuitOpenError, CircuitState

__all__ = ["BreakerWatcher", "CircuitBreaker", "CircuitOpenError", "CircuitState", "Gate", "Permit"]
