"""A plan: the hits of one (tier, route) pair, with its policy names and static headers.

Plans are built once per pair and reused, so a request only looks one up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .decision import Verdict
from .errors import ConfigError
from .headers import HeaderFormat, policy_name
from .policy import Hit, Limit
from .routes import RouteSpec
from .storage.base import merge_hits
from .tiers import Tier

__all__ = ["Plan", "make_plan"]

PolicyKey = tuple[str, Limit]


@dataclass(frozen=True, slots=True, eq=False)
class Plan:
    """Every hit a request of ``tier`` on ``route`` makes (hashed by identity)."""

    tier: Tier
    route: RouteSpec
    hits: Sequence[Hit]
    enforced: Sequence[Hit]
    shadow: frozenset[PolicyKey]
    names: Mapping[PolicyKey, str]
    """The name of each limit the headers report (not the shadow ones), as configured."""
    static_headers: tuple[tuple[bytes, bytes], ...]
    concurrent: bool = False
    """True when the plan takes a concurrency slot (to give back when the request ends)."""
    clash: tuple[Hit, Hit] | None = None
    """Two of its hits on one counter, if any (``check_plan`` refuses them)."""

    def shadow_only(self, verdict: Verdict) -> bool:
        """True when every limit that denied ``verdict`` is a shadow limit."""
        shadow = self.shadow
        return bool(shadow) and all(
            (d.scope, d.policy) in shadow for d in verdict.decisions if not d.allowed)

    def never(self) -> Hit | None:
        """A hit whose cost is larger than its limit can ever admit, if any."""
        return next((hit for hit in self.hits if hit.never), None)


def make_plan(tier: Tier, route: RouteSpec, fmt: HeaderFormat, lease: float = 30.0) -> Plan:
    """Join the tier's limits (at the route's cost), the route's own limits and the
    tier's concurrency slot (always one slot, whatever the route's cost)."""
    tier_hits = tier.hits if route.cost == 1 else tuple(
        Hit(hit.limit, route.cost, hit.scope) for hit in tier.hits)
    joined = tier_hits + route.hits
    if tier.concurrency is not None:
        joined += (Hit(Limit.concurrency(tier.concurrency, lease=lease)),)
    shadow = {(hit.scope, hit.limit) for hit in tier_hits if hit.limit.name in tier.shadow}
    shadow.update((hit.scope, hit.limit) for hit in route.shadow)
    enforced = merge_hits(tuple(hit for hit in joined if (hit.scope, hit.limit) not in shadow))
    hits = merge_hits(joined)  # once here, so the storages need not check per request
    # The headers report the enforced limits; a plan of shadow limits alone (a trial of
    # the whole tier, like global shadow mode) reports them all: seeing them is the point.
    reported = [hit for hit in hits if (hit.scope, hit.limit) not in shadow] or list(hits)
    names: dict[PolicyKey, str] = {}
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
    return Plan(tier, route, hits, enforced, frozenset(shadow), names, tuple(fmt.static(named)),
                tier.concurrency is not None, _clash(joined))


def _clash(hits: Sequence[Hit]) -> tuple[Hit, Hit] | None:
    """The first two of ``hits`` on one counter (same scope, algorithm, rate and
    capacity: a limit's name does not make a counter of its own)."""
    seen: dict[tuple[str, str], Hit] = {}
    for hit in hits:
        first = seen.setdefault(hit.slot, hit)
        if first is not hit:
            return first, hit
    return None


def check_plan(plan: Plan, method_path: str) -> None:
    """Fail at start-up when a request could never pass one of its limits, or when two
    of its limits would count on one counter."""
    if plan.clash is not None:
        first, second = plan.clash
        where = f"route {method_path}" if first.scope else f"tier {plan.tier.name!r}"
        if first.limit == second.limit:
            msg = f"{where}: limit {first.limit.name!r} ({first.limit}) is given twice; drop one"
        else:
            msg = (f"{where}: limits {first.limit.name!r} ({first.limit}) and "
                   f"{second.limit.name!r} ({second.limit}) would count on one counter (the "
                   f"same algorithm, rate and capacity); give one of them another rate or "
                   f"algorithm, or drop it")
        raise ConfigError(msg)
    hit = plan.never()
    if hit is None:
        return
    where = f"route {method_path}" if method_path else "every request"
    msg = (f"{where} costs {hit.cost} but limit {hit.limit.name!r} ({hit.limit}) of tier "
           f"{plan.tier.name!r} admits at most {hit.limit.capacity} at once, so it could "
           f"never pass; lower the cost or raise the limit's capacity (burst)")
    raise ConfigError(msg)
