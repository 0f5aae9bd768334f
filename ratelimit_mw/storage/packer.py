"""The commands a Redis storage writes on its pipeline, packed by hand.

What repeats from one request to the next is packed once and kept (up to 4 096 of
each, then forgotten at once): a limit set's hits, an identity's hash tag, a slot's key,
a route cost's usage argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..decision import Adjustment, Lease
from ..hits import Hit, MergedHits, Slot
from ..rates import MAX_AMOUNT
from .base import UsageRetention, bad_usage
from .keys import counter_suffix, identity_tag
from .lease_ids import new_lease_id
from .settlements import settlement_groups
from .wire import PackedHits, pack_hits, pack_release, pack_settle

__all__ = ["Packer"]

_CACHED = 4096


class Packer:
    """Packs the ``FCALL`` of a decision, the ``ZREM`` of a slot given back and the
    ``EVALSHA`` of a settlement for keys under ``prefix``, each string encoded by
    ``encode`` (the client's encoding)."""

    __slots__ = ("_encode", "_function", "_hits", "_suffixes", "_tags", "_usage_args",
                 "prefix", "retention", "settle_sha")

    def __init__(self, prefix: str, function: str, settle_sha: str, retention: UsageRetention,
                 encode: Callable[[str], bytes]) -> None:
        self.prefix = prefix
        self._function = function  # the decide library's function
        self.settle_sha = settle_sha
        self.retention = retention
        self._encode = encode
        self._hits: dict[int, tuple[object, bool, PackedHits]] = {}
        self._tags: dict[str, bytes] = {}
        self._suffixes: dict[Slot, bytes] = {}  # (scope, uid) -> its counter's key suffix
        self._usage_args: dict[int, bytes] = {}  # units -> decide.lua's usage argument

    def decision(self, key: str, hits: Sequence[Hit], usage: int,
                 clock: bytes) -> tuple[bytes, tuple[Slot, ...], str]:
        """The ``FCALL`` that decides ``hits`` for ``key`` (see decide.lua), the slots it
        may take, and their lease id (empty when none)."""
        packed = self._packed(hits, bool(usage))
        slots = packed.slots
        lease_id = new_lease_id() if slots else ""
        command = packed.command(self.tag(key), clock, lease_id.encode(),
                                 self.usage_arg(usage) + packed.spends if usage else b"")
        return command, slots, lease_id

    def release(self, lease: Lease) -> bytes:
        """``ZREM`` of ``lease``'s id from its slot's sorted set."""
        slot = (lease.scope, lease.uid)
        suffix = self._suffixes.get(slot)
        if suffix is None:
            if len(self._suffixes) >= _CACHED:
                self._suffixes.clear()
            suffix = self._suffixes[slot] = self._encode(counter_suffix(*slot))
        return pack_release(self.tag(lease.key) + suffix, lease.id.encode())

    def settlements(self, adjustments: Sequence[Adjustment],
                    clock: bytes) -> list[tuple[Sequence[Adjustment], bytes]]:
        """The settle.lua call of each identity's adjustments, beside them."""
        sha = self.settle_sha.encode()
        if len(adjustments) == 1 or all(a.key == adjustments[0].key for a in adjustments):
            groups: Sequence[Sequence[Adjustment]] = [adjustments]  # the usual: one request's
        else:
            groups = settlement_groups(adjustments)
        return [(group, pack_settle(sha, self.tag(group[0].key), clock, group))
                for group in groups]

    def usage_arg(self, units: int) -> bytes:
        """``hours,days,units``: the retention and what one admitted request adds."""
        arg = self._usage_args.get(units)
        if arg is None:
            # Checked before the script runs: Redis takes no more, and a failed INCRBY
            # would leave the limits it follows charged.
            if not isinstance(units, int) or not 0 < units <= MAX_AMOUNT:
                raise bad_usage(units)
            arg = f"{self.retention.hours},{self.retention.days},{int(units)}".encode()
            if len(self._usage_args) < 64:  # a few route costs; any others are made anew
                self._usage_args[units] = arg
        return arg

    def tag(self, key: str) -> bytes:
        """The encoded hash tag of ``key``'s keys (an identity decides, gives its slot
        back, and comes again)."""
        tag = self._tags.get(key)
        if tag is None:
            if len(self._tags) >= _CACHED:
                self._tags.clear()
            tag = self._tags[key] = self._encode(identity_tag(self.prefix, key))
        return tag

    def _packed(self, hits: Sequence[Hit], usage: bool) -> PackedHits:
        """What the decisions of ``hits`` share on the wire. A limit set's merged hits, or
        the one hit of a one-limit set (never changed, so known by identity), skip hashing
        every hit again."""
        known: object = hits
        if type(hits) is not MergedHits:
            if type(hits) is not tuple or len(hits) != 1:
                return pack_hits(self._function, tuple(hits), usage)
            known = hits[0]
        cached = self._hits.get(id(known))
        if cached is not None and cached[0] is known and cached[1] is usage:
            return cached[2]
        packed = pack_hits(self._function, tuple(hits), usage)
        if len(self._hits) >= _CACHED:
            self._hits.clear()
        self._hits[id(known)] = (known, usage, packed)  # held: its id stays its own
        return packed
