"""A limit set: the hits of one (tier, route) pair, with its policy names and static
headers.

Limit sets are built once per pair and reused, so a request only looks one up. A set
also knows which of its limits are shadow limits (decided and reported, never enforced).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .decision import Verdict
from .errors import ConfigError
from .headers import HeaderFormat, policy_name
from .hits import Hit, Slot, merge_hits
from .limits import Limit, LimitKey
from .routes import NO_ROUTE, RouteSpec
from .tiers import Tier

__all__ = ["LimitSet", "LimitSets", "check_limit_set", "enforced_denial", "make_limit_set",
           "with_shadowed"]

_log = logging.getLogger("ratelimit_mw")
_KEPT: Final = 8192  # limit sets kept (then forgotten at once): tiers by routes, with room to spare


@dataclass(frozen=True, slots=True, eq=False)
class LimitSet:
    """Every hit a request of ``tier`` on ``route`` makes (hashed by identity)."""

    tier: Tier
    route: RouteSpec
    hits: Sequence[Hit]
    enforced: Sequence[Hit]
    shadow: frozenset[LimitKey]
    names: Mapping[LimitKey, str]
    """The name of each limit the headers report (not the shadow ones), as configured."""
    static_headers: tuple[tuple[bytes, bytes], ...]
    concurrent: bool = False
    """True when the set takes a concurrency slot (to give back when the request ends)."""
    clash: tuple[Hit, Hit] | None = None
    """Two of its hits on one counter, if any (``check_limit_set`` refuses them)."""
    blocked_until: float = 0.0
    """When an override blocks its caller: the epoch time until which nothing is
    admitted (0: not blocked)."""
    settled: tuple[Hit, ...] = ()
    """The hits whose charge the response settles (their estimate reserved meanwhile)."""
    metered: bool = False
    """True when some limit counts another unit than requests (tokens, say)."""
    partitioned: tuple[Hit, ...] = ()
    """The hits counted apart per what the request says (``Limit(per=...)``): a
    request's own set has them in its partitions (``LimitSets.partitioned``)."""
    shaped: bool = False
    """True when a limit holds requests for their turn (``Limit(max_delay=...)``)."""
    entering: LimitSet | None = None
    """A shaped set's concurrency slot, apart: taken when its request enters the app,
    not while it waits for its turn."""
    after: bool = False
    """True when its requests hold something after the decision besides slots: a charge
    to settle, a turn to wait for (the middleware's fast path skips the rest)."""

    def shadow_only(self, verdict: Verdict) -> bool:
        """True when every limit that denied ``verdict`` is a shadow limit."""
        shadow = self.shadow
        return bool(shadow) and all(
            (d.scope, d.limit) in shadow for d in verdict.decisions if not d.allowed)

    def never(self) -> Hit | None:
        """A hit whose cost is larger than its limit can ever admit, if any."""
        return next((hit for hit in self.hits if hit.never), None)


def make_limit_set(
    tier: Tier, route: RouteSpec, fmt: HeaderFormat, lease: float = 30.0,
) -> LimitSet:
    """Join the tier's limits (at the route's cost), the route's own limits and the
    tier's concurrency slot (always one slot, whatever the route's cost)."""
    tier_hits = tier.hits if route.cost == 1 and not tier.metered else tuple(
        charged for hit in tier.hits if (charged := _charged(hit, route)) is not None)
    joined = tuple(_reserving(hit) for hit in tier_hits + route.hits)
    shaped = any(hit.limit.max_delay for hit in joined)
    taking = (Hit(Limit.concurrency(tier.concurrency, lease=lease))
              if tier.concurrency is not None else None)
    if taking is not None and not shaped:
        joined += (taking,)
    shadow = {(hit.scope, hit.limit) for hit in tier_hits if hit.limit.name in tier.shadow}
    shadow.update((hit.scope, hit.limit) for hit in route.shadow)
    enforced = merge_hits(tuple(hit for hit in joined if (hit.scope, hit.limit) not in shadow))
    hits = merge_hits(joined)  # once here, so the storages need not check per request
    # The headers report the enforced limits; a set of shadow limits alone (a trial of
    # the whole tier, like global shadow mode) reports them all: seeing them is the point.
    reported = [hit for hit in hits if (hit.scope, hit.limit) not in shadow] or list(hits)
    names: dict[LimitKey, str] = {}
    taken: set[str] = set()  # as written in a header, where two names must not meet
    for hit in reported:
        slot = (hit.scope, hit.limit)
        if slot in names:
            continue
        base = name = hit.limit.name
        n = 1
        while (written := policy_name(name)) in taken:
            n += 1
            name = f"{base}-{n}"
        taken.add(written)
        names[slot] = name
    named = [(names[(hit.scope, hit.limit)], hit.limit) for hit in reported]
    settled = tuple(hit for hit in hits if hit.limit.settlement is not None)
    return LimitSet(tier, route, hits, enforced, frozenset(shadow), names,
                    tuple(fmt.static(named)), taking is not None and not shaped, _clash(joined),
                    settled=settled, metered=any(hit.limit.unit != "requests" for hit in hits),
                    partitioned=tuple(hit for hit in hits if hit.limit.per is not None),
                    shaped=shaped, after=shaped or bool(settled),
                    entering=_entering(tier, route, fmt, taking) if shaped else None)


def _entering(tier: Tier, route: RouteSpec, fmt: HeaderFormat, slot: Hit | None
              ) -> LimitSet | None:
    """The set of a shaped set's concurrency ``slot`` alone (None without one)."""
    if slot is None:
        return None
    hits = merge_hits((slot,))
    names = {(slot.scope, slot.limit): slot.limit.name}
    return LimitSet(tier, route, hits, hits, frozenset(), names,
                    tuple(fmt.static([(slot.limit.name, slot.limit)])), True)


def _partitioned(limit_set: LimitSet, values: tuple[str, ...]) -> LimitSet:
    """``limit_set`` with its partitioned hits moved to the scopes of ``values``."""
    moved = {(hit.scope, hit.limit): Hit(hit.limit, hit.cost, f"{hit.scope}|{value}")
             for hit, value in zip(limit_set.partitioned, values, strict=True)}

    def move(hits: Sequence[Hit]) -> tuple[Hit, ...]:
        return tuple(moved.get((hit.scope, hit.limit), hit) for hit in hits)

    def key(old: LimitKey) -> LimitKey:
        hit = moved.get(old)
        return old if hit is None else (hit.scope, hit.limit)

    return dataclasses.replace(
        limit_set, hits=merge_hits(move(limit_set.hits)),
        enforced=merge_hits(move(limit_set.enforced)),
        shadow=frozenset(key(k) for k in limit_set.shadow),
        names={key(k): name for k, name in limit_set.names.items()},
        settled=move(limit_set.settled), partitioned=())


def _charged(hit: Hit, route: RouteSpec) -> Hit | None:
    """A tier's ``hit`` as a request on ``route`` is charged: a request limit at the
    route's cost; a limit of another unit at the estimate the route spends of it, or
    not at all where the route spends none (``@spends``)."""
    unit = hit.limit.unit
    if unit == "requests":
        return hit if route.cost == 1 else Hit(hit.limit, route.cost, hit.scope)
    estimate = next((e for spent, e in route.spends if spent == unit), None)
    return None if estimate is None else Hit(hit.limit, estimate, hit.scope)


def _reserving(hit: Hit) -> Hit:
    """``hit`` at the cost reserved before the app runs: its limit's estimate, where it
    gives one, else the request's cost."""
    settlement = hit.limit.settlement
    if settlement is None or settlement.estimate is None or settlement.estimate == hit.cost:
        return hit
    return Hit(hit.limit, settlement.estimate, hit.scope)


def _clash(hits: Sequence[Hit]) -> tuple[Hit, Hit] | None:
    """The first two of ``hits`` on one counter (same scope, algorithm, rate and
    capacity: a limit's name does not make a counter of its own)."""
    seen: dict[Slot, Hit] = {}
    for hit in hits:
        first = seen.setdefault(hit.slot, hit)
        if first is not hit:
            return first, hit
    return None


def check_limit_set(limit_set: LimitSet, method_path: str) -> None:
    """Fail at start-up when a request could never pass one of its limits, or when two
    of its limits would count on one counter."""
    if limit_set.clash is not None:
        first, second = limit_set.clash
        where = f"route {method_path}" if first.scope else f"tier {limit_set.tier.name!r}"
        if first.limit == second.limit:
            msg = f"{where}: limit {first.limit.name!r} ({first.limit}) is given twice; drop one"
        else:
            msg = (f"{where}: limits {first.limit.name!r} ({first.limit}) and "
                   f"{second.limit.name!r} ({second.limit}) would count on one counter (the "
                   f"same algorithm, rate and capacity); give one of them another rate or "
                   f"algorithm, or drop it")
        raise ConfigError(msg)
    hit = limit_set.never()
    if hit is None:
        return
    where = f"route {method_path}" if method_path else "every request"
    msg = (f"{where} costs {hit.cost} but limit {hit.limit.name!r} ({hit.limit}) of tier "
           f"{limit_set.tier.name!r} admits at most {hit.limit.capacity} at once, so it could "
           f"never pass; lower the cost or raise the limit's capacity (burst)")
    raise ConfigError(msg)


class LimitSets:
    """The limit set of each (tier, route) pair, made at the pair's first request.

    ``check`` refuses, at start-up, any pair of the app's known routes whose requests
    could never pass. A route the app gains later is checked at its first request,
    with no start-up left to fail: logged once, its requests refused as never
    admissible.
    """

    __slots__ = ("_format", "_lease", "_made", "_parts", "_reported")

    def __init__(self, fmt: HeaderFormat, lease: float) -> None:
        self._format = fmt
        self._lease = lease
        self._made: dict[tuple[str, RouteSpec], LimitSet] = {}
        self._reported: set[tuple[str, str]] = set()  # (tier, route) found bad late
        # (a set's id, its partitions' values) -> (that set, its request's own set)
        self._parts: dict[tuple[int, tuple[str, ...]], tuple[LimitSet, LimitSet]] = {}

    def partitioned(self, limit_set: LimitSet, values: tuple[str, ...]) -> LimitSet:
        """``limit_set`` with each partitioned hit counted under its ``values``' scope;
        made once per set and values (a caller asking again gets the same set, which
        the caches of blocked keys and of packed commands know by identity)."""
        made = self._parts.get((id(limit_set), values))
        if made is not None and made[0] is limit_set:
            return made[1]
        if len(self._parts) >= _KEPT:
            self._parts.clear()
        own = _partitioned(limit_set, values)
        self._parts[(id(limit_set), values)] = (limit_set, own)
        return own

    def get(self, tier: Tier, route: RouteSpec) -> LimitSet:
        """The limit set of ``tier`` on ``route``."""
        limit_set = self._made.get((tier.name, route))
        if limit_set is not None and limit_set.tier is tier:
            return limit_set
        if limit_set is not None:  # another tier of that name (an override's): not kept
            return self.make(tier, route)
        if len(self._made) >= _KEPT:
            self._made.clear()
        limit_set = self._made[(tier.name, route)] = self.make(tier, route)
        return limit_set

    def make(self, tier: Tier, route: RouteSpec) -> LimitSet:
        """A new limit set of ``tier`` on ``route``, checked (for a caller that keeps it)."""
        limit_set = make_limit_set(tier, route, self._format, self._lease)
        self._check_late(limit_set)
        return limit_set

    def check(self, tiers: Iterable[Tier], routes: Iterable[RouteSpec]) -> None:
        """Refuse to start when a request of some tier on some route (or on none) could
        never pass (a cost above a capacity, two limits on one counter)."""
        specs = [(NO_ROUTE, ""), *((spec, spec.label) for spec in routes)]
        for tier in tiers:
            for spec, label in specs:
                if not spec.exempt:
                    check_limit_set(make_limit_set(tier, spec, self._format, self._lease), label)

    def _check_late(self, limit_set: LimitSet) -> None:
        try:
            check_limit_set(limit_set, limit_set.route.label)
        except ConfigError as exc:
            seen = (limit_set.tier.name, limit_set.route.label)
            if seen not in self._reported:
                self._reported.add(seen)
                _log.error("ratelimit_mw: %s", exc)


def with_shadowed(limit_set: LimitSet, verdict: Verdict, enforced: Verdict | None) -> Verdict:
    """The verdict of the enforced limits alone, with the shadow limits' decisions from
    ``verdict`` (which only they denied) put back in the set's order."""
    if enforced is None:  # the storage failed on the second call: let it through
        return Verdict(True, verdict.decisions)
    shadow = limit_set.shadow
    counted = iter(enforced.decisions)
    return Verdict(enforced.allowed, tuple(
        d if (d.scope, d.limit) in shadow else next(counted) for d in verdict.decisions),
        enforced.leases, enforced.at)


def enforced_denial(limit_set: LimitSet, verdict: Verdict) -> Verdict:
    """A refused verdict as its enforced limits see it: a shadow limit that also denied
    sets neither Retry-After, nor the reported policy, nor how long the key stays
    cached as blocked (it is reported as admitting, with what it has left)."""
    shadow = limit_set.shadow
    return verdict._replace(decisions=tuple(
        d._replace(allowed=True, retry_after=0.0)
        if not d.allowed and (d.scope, d.limit) in shadow else d
        for d in verdict.decisions))
