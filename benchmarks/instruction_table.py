"""What ``instructions.py`` prints and saves: each app's instructions per request, per
build, with its ratios to the two controls.

The controls (``bare``, ``headers``) and the peers do not run ratelimit_mw, so they are
counted once and shown in the first build's column; ratelimit_mw's apps are counted on
every build asked for. A ratio is the app's count over the control's: ``1.04`` costs the
server 4 % more instructions per request than the control.
"""

from __future__ import annotations

import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

BUILD_TITLES = {"source": "from source (pip install)", "compiled": "compiled (mypyc)"}


class Count(NamedTuple):
    """One counted run of one app."""

    app: str
    build: str
    """The build of ratelimit_mw the server imported (``compiled`` or ``source``)."""
    instructions: int
    """Total ``Ir`` of the server process over the counted requests."""
    requests: int
    statuses: dict[int, int]
    started: float
    """Seconds from launching valgrind until uvicorn listened."""
    warmed: float
    """Seconds of warm-up."""
    counted: float
    """Seconds of the counted requests."""
    total: float
    """Seconds of the whole run, server stop included."""
    command: str
    """The server's command line, for a shell."""
    origin: str
    """Where the server imported ratelimit_mw from."""

    @property
    def per_request(self) -> float:
        """Instructions per counted request."""
        return self.instructions / self.requests


def expected_status(app: str) -> int:
    """The status every response of ``app`` must have (any other: a failed decision)."""
    return 429 if app == "denial" else 200


def medians(counts: Sequence[Count]) -> dict[str, dict[str, float]]:
    """``{build: {app: median instructions per request}}``, in the order counted."""
    runs: dict[str, dict[str, list[float]]] = {}
    for done in counts:
        runs.setdefault(done.build, {}).setdefault(done.app, []).append(done.per_request)
    return {build: {app: statistics.median(values) for app, values in apps.items()}
            for build, apps in runs.items()}


def _number(value: float) -> str:
    """``value`` rounded, with spaces between thousands, as the benchmarks' READMEs write it."""
    return f"{value:,.0f}".replace(",", " ")


def table(counts: Sequence[Count]) -> list[str]:
    """The markdown table: per build, each app's median count and its ratios to the
    controls (counted once, on the first build)."""
    by_build = medians(counts)
    builds = list(by_build)
    controls = by_build[builds[0]]
    apps = list(dict.fromkeys(app for build in builds for app in by_build[build]))
    header, rule = "| app |", "|---|"
    for build in builds:
        header += f" {BUILD_TITLES.get(build, build)} | x headers | x bare |"
        rule += "---:|---:|---:|"
    lines = [header, rule]
    for app in apps:
        line = f"| {app} |"
        for build in builds:
            value = by_build[build].get(app)
            if value is None:
                line += " | | |"
                continue
            line += (f" {_number(value)} | {value / controls['headers']:.3f} | "
                     f"{value / controls['bare']:.3f} |")
        lines.append(line)
    spreads = _spreads(counts)
    if spreads:
        lines += ["", "Spread of the repeated runs (max - min over the median): " + ", ".join(
            f"{app} ({build}) {spread:.2%}" for (build, app), spread in spreads.items())]
    return lines


def _spreads(counts: Sequence[Count]) -> dict[tuple[str, str], float]:
    """The spread of each (build, app) counted more than once."""
    runs: dict[tuple[str, str], list[float]] = {}
    for done in counts:
        runs.setdefault((done.build, done.app), []).append(done.per_request)
    return {key: (max(values) - min(values)) / statistics.median(values)
            for key, values in runs.items() if len(values) > 1}


def report(counts: Sequence[Count], server: str, requests: int, warmup: int,
           connections: int, repeat: int) -> list[str]:
    """The commands, where ratelimit_mw came from, and the table."""
    lines = [f"# {shlex.join([sys.executable, *sys.argv])}",
             f"# server ({server}), first run: {counts[0].command}",
             *sorted({f"# {done.origin}" for done in counts}),
             f"# {requests} requests counted per run after {warmup} of warm-up, "
             f"{connections} keep-alive connections; {repeat} run(s) per app; every "
             f"response had its expected status (failure mode closed, so a failed "
             f"decision would have been a 503)"]
    return [*lines, "", *table(counts)]


def results(counts: Sequence[Count], server: str, requests: int,
            connections: int) -> dict[str, object]:
    """What ``--json`` writes: the settings and, per build, each app's median."""
    return {"date": time.strftime("%Y-%m-%d"), "server": server, "requests": requests,
            "connections": connections,
            "builds": {build: {app: round(value) for app, value in apps.items()}
                       for build, apps in medians(counts).items()}}


def progress(done: Count, run: int, repeat: int) -> str:
    """One line on a finished run: its count, the statuses and how long it took."""
    statuses = ", ".join(f"{n} answered {status}" for status, n in sorted(done.statuses.items()))
    return (f"# {done.app} [{done.build}] ({run}/{repeat}): {_number(done.per_request)} "
            f"instructions/request ({statuses}); server up {done.started:.1f} s, warm-up "
            f"{done.warmed:.1f} s, counted {done.counted:.1f} s, run {done.total:.1f} s")
