"""Commands packed by hand, and the decisions read from their replies.

A decision's ``FCALL`` is mostly the same bytes from one request to the next: the
limits of its limit set. They are packed once per list of hits (``pack_hits``); a
request only joins them to what changes, its identity's keys, a lease id and the usage
spec, without redis-py encoding every argument again. ``pipe`` writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any, Final

from ..decision import Adjustment, Lease, Verdict, decision_from
from ..hits import Hit, Slot, spends
from ..limits import Limit
from .keys import counter_suffix

__all__ = [
    "PackedHits",
    "algorithm_arg",
    "bulk",
    "history_unit",
    "hit_arg",
    "pack_function_load",
    "pack_hits",
    "pack_release",
    "pack_script_load",
    "pack_settle",
    "slots_taken",
    "spends_arg",
    "verdict_from",
]


def bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    size = len(value)
    if size < _SHORT:  # keys, lease ids, arguments: the length's prefix made once
        return _PREFIXES[size] + value + b"\r\n"
    return b"$%d\r\n%b\r\n" % (size, value)


_SHORT = 256
_PREFIXES: Final = [b"$%d\r\n" % size for size in range(_SHORT)]
_EMPTY: Final = b"$0\r\n\r\n"  # an empty bulk string: no test clock, lease or usage


class PackedHits:
    """The ``FCALL`` of one list of hits, but for the identity's keys and the first
    arguments. A plain class, not a named tuple: compiled, ``command`` is then called
    directly, not bound and called through Python's protocol (about 270 instructions)."""

    __slots__ = ("head", "keys", "packed_keys", "slots", "spends", "tail")

    def __init__(self, head: bytes, keys: tuple[bytes, ...], tail: bytes,
                 slots: tuple[Slot, ...], spends: bytes = b"") -> None:
        self.head: Final = head
        """Argument count, ``FCALL``, the function's name and the number of keys."""
        self.keys: Final = keys
        """Each key's end, after the identity's tag."""
        self.tail: Final = tail
        """One argument per hit: ``algorithm amount period capacity cost``."""
        self.slots: Final = slots
        """``(scope, uid)`` of each hit that takes a concurrency slot."""
        self.packed_keys: Final[dict[bytes, bytes]] = {}
        """The keys packed for each recent identity tag (an identity comes again)."""
        self.spends: Final = spends
        """What the hits spend of other units, as decide.lua's usage argument ends
        (``;tokens=256``)."""

    def command(self, tag: bytes, clock: bytes, lease: bytes, usage: bytes) -> bytes:
        """The whole command for one identity (see decide.lua for the arguments)."""
        cache = self.packed_keys
        keys = cache.get(tag)
        if keys is None:
            if len(cache) >= _PACKED_KEYS:
                cache.clear()
            size = len(tag)
            keys = cache[tag] = b"".join([
                b"$%d\r\n%b%b\r\n" % (size + len(key), tag, key) for key in self.keys])
        # Joined with +: compiled, a join (a list, then each part's buffer) costs more.
        return (self.head + keys + (bulk(clock) if clock else _EMPTY)
                + (bulk(lease) if lease else _EMPTY) + (bulk(usage) if usage else _EMPTY)
                + self.tail)


_PACKED_KEYS = 1024


@lru_cache(maxsize=512)
def pack_hits(function: str, hits: tuple[Hit, ...], usage: bool) -> PackedHits:
    """Pack what the decisions of one list of hits share (with usage counted, or not),
    calling the decision's ``function``."""
    keys = [counter_suffix(hit.scope, hit.limit.uid).encode() for hit in hits]
    if usage and not keys:
        keys.append(b"u:")  # a key to route by (see decide.lua)
    tail = b"".join(bulk(hit_arg(hit).encode()) for hit in hits)
    count = 3 + len(keys) + 3 + len(hits)
    head = b"*%d\r\n%b%b%b" % (count, bulk(b"FCALL"), bulk(function.encode()),
                              bulk(b"%d" % len(keys)))
    return PackedHits(head, tuple(keys), tail, slots_taken(hits),
                      spends_arg(hits).encode() if usage else b"")


def spends_arg(hits: Sequence[Hit]) -> str:
    """The end of decide.lua's usage argument: ``;unit=amount`` per other unit spent."""
    return "".join(f";{unit}={amount}" for unit, amount in spends(hits))


def hit_arg(hit: Hit) -> str:
    """decide.lua's argument for ``hit``: ``algorithm amount period capacity cost``, one
    string, so that the script parses it once (see hits.lua)."""
    limit = hit.limit
    return (f"{algorithm_arg(limit)} {limit.amount} {limit.period_us} {limit.capacity} "
            f"{hit.cost}")


def algorithm_arg(limit: Limit) -> str:
    """decide.lua's name of ``limit``'s algorithm: a shaped limit's carries its longest
    wait, ``gcra+<microseconds>``."""
    if limit.max_delay_us:
        return f"{limit.algorithm}+{limit.max_delay_us}"
    return limit.algorithm


def slots_taken(hits: Sequence[Hit]) -> tuple[Slot, ...]:
    """``(scope, uid)`` of each hit that takes a concurrency slot when admitted."""
    return tuple((hit.scope, hit.limit.uid) for hit in hits
                 if hit.limit.is_concurrency and hit.cost)


def pack_script_load(script: str) -> bytes:
    """``SCRIPT LOAD script``."""
    return b"*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n%b" % bulk(script.encode())


def pack_function_load(library: str) -> bytes:
    """``FUNCTION LOAD REPLACE library``."""
    return b"*4\r\n$8\r\nFUNCTION\r\n$4\r\nLOAD\r\n$7\r\nREPLACE\r\n%b" % bulk(library.encode())


def pack_release(key: bytes, lease: bytes) -> bytes:
    """``ZREM key lease``: one concurrency slot given back."""
    return b"*3\r\n$4\r\nZREM\r\n" + bulk(key) + bulk(lease)


def pack_settle(sha: bytes, tag: bytes, clock: bytes, group: Sequence[Adjustment]) -> bytes:
    """The ``EVALSHA`` of settle.lua for one identity's ``group`` (see settle.lua for the
    arguments), whose keys start with the identity's encoded ``tag``."""
    keys: list[bytes] = []
    args = [bulk(clock)]
    counted: set[tuple[str, float]] = set()
    for _, hit, delta, at in group:
        limit = hit.limit
        keys.append(bulk(tag + _suffix(hit.scope, limit.uid)))
        args += (_settled_limit(limit), bulk(b"%d" % delta),
                 bulk(b"%d" % round(at * 1_000_000)),
                 bulk(history_unit(limit, at, counted).encode()))
    return b"*%d\r\n%b%b%b%b%b" % (
        4 + len(keys) + 7 * len(group), bulk(b"EVALSHA"), bulk(sha), bulk(b"%d" % len(keys)),
        b"".join(keys), b"".join(args))


def history_unit(limit: Limit, at: float, counted: set[tuple[str, float]]) -> str:
    """The unit whose usage history a settlement of ``limit`` for the request decided at
    ``at`` moves: its own, the first time that request's unit is seen in ``counted``
    (a tier's tokens per minute and per day are one spending); else none (``""``)."""
    unit = limit.unit
    if unit == "requests" or (unit, at) in counted:
        return ""
    counted.add((unit, at))
    return unit


@lru_cache(maxsize=1024)
def _suffix(scope: str, uid: str) -> bytes:
    return counter_suffix(scope, uid).encode()


@lru_cache(maxsize=512)
def _settled_limit(limit: Limit) -> bytes:
    """A limit's first four settle.lua arguments: algorithm, amount, period, capacity."""
    return b"".join(bulk(str(value).encode()) for value in (
        limit.algorithm, limit.amount, limit.period_us, limit.capacity))



def verdict_from(key: str, hits: Sequence[Hit], lease_id: str, slots: tuple[Slot, ...],
             reply: Any) -> Verdict:
    """The verdict in a decision's reply: admitted, the clock (µs), then four values per
    hit (admitted, remaining, reset µs, retry µs); a reply of another length raises."""
    values: list[int] = reply  # raises TypeError (compiled) where it is not a list of ints
    decisions = []
    i = 2
    for hit in hits:
        decisions.append(decision_from(
            hit, values[i] != 0, values[i + 1], values[i + 2], values[i + 3]))
        i += 4
    if i != len(values):
        raise ValueError(len(values))
    allowed = values[0] != 0
    leases = tuple([Lease(key, scope, uid, lease_id) for scope, uid in slots]
                   ) if allowed and lease_id else ()
    return Verdict(allowed, tuple(decisions), leases, values[1] / 1_000_000)
