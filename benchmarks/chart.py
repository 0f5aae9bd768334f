"""Draw the instruction counts of ``instructions.py --json`` as a bar chart (a PNG).

    python benchmarks/instructions.py --peers --json results.json
    python benchmarks/chart.py results.json benchmarks/speed.png

Each bar is an app's speed relative to the ``headers`` control (the bare app plus four
constant rate-limit headers, no limiter): the control's count over the app's, so 1.0 is
as cheap as sending the headers and higher is faster. ratelimit_mw stands beside each
peer library, on memory and on Redis, once per build counted (from source, what ``pip
install`` gives, and compiled). Needs matplotlib (the lock's ``bench`` group: ``./scripts/venv``).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

GROUPS = {"memory": ("memory", "-memory"), "Redis": ("redis", "-redis")}
"""Each group of bars: ratelimit_mw's app, and the suffix of the peers' apps."""
OURS = {"compiled": "ratelimit_mw (compiled)", "source": "ratelimit_mw (pure Python)"}
OUR_COLOURS = {"compiled": "#1f6feb", "source": "#79c0ff"}
COLOURS = ["#8b949e", "#d29922", "#3fb950", "#db6d28", "#a371f7"]
"""The peers' bars; ratelimit_mw's are blue."""
NOTES = {"asgi-ratelimit": "asgi-ratelimit (sends no headers)"}


def bars(builds: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """``{group: {library: headers/app}}`` of the apps counted, per build: the controls
    and the peers are in the first build's counts."""
    first = next(iter(builds.values()))
    control = first["headers"]
    out: dict[str, dict[str, float]] = {}
    for group, (ours, suffix) in GROUPS.items():
        row = {OURS.get(build, build): control / apps[ours]
               for build, apps in builds.items() if ours in apps}
        for app, count in sorted(first.items()):
            if app.endswith(suffix) and app != ours:
                row[app.removesuffix(suffix)] = control / count
        if row:
            out[group] = row
    return out


def draw(results: dict[str, object], target: Path) -> None:
    """Write the chart of ``results`` to ``target``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    builds = results["builds"]
    assert isinstance(builds, dict)
    groups = bars(builds)
    libraries = list(dict.fromkeys(lib for row in groups.values() for lib in row))
    width = 0.8 / len(libraries)
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    peers = iter(COLOURS)
    for i, library in enumerate(libraries):
        heights = [groups[group].get(library, 0.0) for group in groups]
        xs = [g + (i - (len(libraries) - 1) / 2) * width for g in range(len(groups))]
        ours = [build for build, name in OURS.items() if name == library]
        colour = OUR_COLOURS[ours[0]] if ours else next(peers, "#6e7781")
        drawn = axes.bar(xs, heights, width * 0.95, label=NOTES.get(library, library),
                         color=colour)
        axes.bar_label(drawn, fmt="%.2f", fontsize=7)
    axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    axes.set_xticks(range(len(groups)), list(groups))
    axes.set_ylabel("speed relative to four constant headers")
    axes.set_title(f"Instructions per request under uvicorn ({results['server']}, "
                   f"{results['date']})", fontsize=10)
    axes.legend(fontsize=8, ncols=3)
    figure.tight_layout()
    figure.savefig(target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="the JSON of instructions.py --json")
    parser.add_argument("target", type=Path, help="the PNG to write")
    args = parser.parse_args()
    draw(json.loads(args.results.read_text()), args.target)


if __name__ == "__main__":
    main()
