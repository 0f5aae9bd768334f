"""How long ``import ratelimit_mw.client`` takes beside ``import httpx`` alone.

    python benchmarks/import_time.py [--python PATH] [--runs 9]

Each import runs in a fresh interpreter (``python -c``), ``--runs`` times, and the best
run counts (the others measure the host's noise). Run it with the interpreter of a venv
holding ``ratelimit_mw[client]`` alone, as a user of the client installs it; the
difference between the two lines is what the client adds to a program's start.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = """
import json, sys, time
start = time.perf_counter()
import {module}
took = time.perf_counter() - start
server_side = [m for m in ("starlette", "redis", "limits", "pydantic", "fastapi")
               if m in sys.modules]
print(json.dumps([took, len(sys.modules), server_side]))
"""


def best_of(python: str, module: str, runs: int) -> tuple[float, int, list[str]]:
    """The fastest of ``runs`` imports of ``module``: seconds, modules loaded, and the
    server-side packages among them."""
    results = []
    for _ in range(runs):
        out = subprocess.run([python, "-c", PROBE.format(module=module)], check=True,
                             capture_output=True, text=True).stdout
        results.append(json.loads(out))
    took, modules, server_side = min(results)
    return took, modules, server_side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    subprocess.run([args.python, "-c", "import ratelimit_mw.client"], check=True)  # .pyc
    rows = [(module, *best_of(args.python, module, args.runs))
            for module in ("httpx", "ratelimit_mw.client")]
    print(f"| import | best of {args.runs}, ms | modules loaded | server side loaded |")
    print("|---|---:|---:|---|")
    for module, took, modules, server_side in rows:
        print(f"| `{module}` | {took * 1000:.1f} | {modules} | {', '.join(server_side) or '-'} |")
    print(f"\nthe client adds {(rows[1][1] - rows[0][1]) * 1000:.1f} ms to `import httpx`")


if __name__ == "__main__":
    main()
