"""Where a request's instructions go, by function group, from dumps kept by
``instructions.py --keep DIR`` with the frame hook of ``frames.py`` on.

Every instruction of the dump is given to the innermost *named* function on its stack:
a function of ratelimit_mw compiled by mypyc, an interpreted Python function (named by
the hook, ``py:``), or an entry point of uvloop, ``_asyncio``, hiredis or httptools.
CPython's own C functions (calls, attribute look-ups, deallocation) count for the
function that caused them. callgrind must keep enough callers per context to reach one
(``--separate-callers=30``); the few that do not count in the rest. The functions are
then summed into the groups below, per request; ``headers`` stands beside each app.

    ./scripts/compile && .venv/bin/python benchmarks/frames.py
    VALGRIND_OPTS=--separate-callers=30 PYTHONPATH=$PWD/build/frames \\
        PYFRAMES_MAP=/tmp/frames/map .venv/bin/python benchmarks/instructions.py \\
        --requests 2000 --warmup 2000 --build compiled --keep /tmp/frames \\
        headers redis redis-tier
    .venv/bin/python benchmarks/instruction_groups.py /tmp/frames redis redis-tier

The map (``PYFRAMES_MAP``, one file per server process) and the dumps must share the
directory. ``--requests`` must be the count ``instructions.py`` was given.

``--owners N`` also prints each app's N costliest functions.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

# The groups, in the order printed: (key, label, member keys); a row whose label starts
# with "·" is part of the row above it.
ROWS: list[tuple[str, str, tuple[str, ...]]] = [
    ("mw", "the middleware's own steps: its coroutine, the `Outcome`", ("mw",)),
    ("key", "key and tier: `Limiter.charge_now` (route, client IP, identity, limit set)",
     ("key",)),
    ("decide", "the decision around the call: `Limiter.decide`, blocked keys, "
     "`GuardedStorage` and its breaker, `RedisStorage.decide_within`",
     ("decide", "verdict")),
    ("verdict", "· the reply made `Decision`s and a `Verdict` (`verdict_from`, "
     "`decision_from`)", ("verdict",)),
    ("pack", "packing the command: `storage/wire.py`, `storage/packer.py`",
     ("pack", "hash")),
    ("hash", "· `pack_hits`'s `lru_cache` key: the `Hit` dataclass's `__hash__`, "
     "interpreted", ("hash",)),
    ("pipe", "the pipeline: `_queue`; `storage/pipe.py`, `storage/inflight.py`",
     ("queue", "flush", "answer", "pipe")),
    ("queue", "· queueing: `_queue`, `Pipeline.put`, `Pipeline.connected`", ("queue",)),
    ("flush", "· flushing: `Pipeline.flush`, `Batch`, `live`, `Pipe.write`", ("flush",)),
    ("answer", "· answering: `Pipeline.answer`, `Batch.answered`, `report_failure`",
     ("answer",)),
    ("read", "reading the reply: `Pipe.data_received`, hiredis", ("read",)),
    ("hdr", "headers: `Limiter._finish` → `HeaderFormat.dynamic`, `AddingHeaders` → "
     "`with_headers` (`headers`: its interpreted wrapper)", ("hdr",)),
    ("slot", "the concurrency slot: `_holding`, holds, lease renewals, disconnect watch, "
     "lease id, `release_now`; redis-py's `Encoder.encode`, interpreted", ("slot",)),
    ("loop", "asyncio and uvloop: their C, and `asyncio/*.py`, `_weakrefset.py`",
     ("loop",)),
    ("rest", "the rest: uvicorn, httptools, Starlette, the app", ("rest",)),
    ("hook", "the frame hook (measurement only)", ("hook",)),
]

# mypyc's runtime helpers live in the same library as the compiled functions; they are
# CPython-level work, counted for their caller.
_RUNTIME = re.compile(r"^CPy(Iter|_|Dict|List|Tagged|Object|Str|Bytes|Type|Sequence|Long|"
                      r"Function|Gen|Statics|Error|Tuple|Arg|Import|Module|Bool|Float|Vector)")
_COMPILED = re.compile(r"^(CPyDef_|CPyPy_|CPyDunder_)|^[a-z_0-9]+___\w+_(dealloc|traverse|"
                       r"clear|new|setup)$")
_MODULE = re.compile(r"^(?:CPyDef_|CPyPy_|CPyDunder_\w*?_(?=[a-z_0-9]+___))?([a-z_0-9]+?)___")
_PIPE_STEPS = {"Pipeline.put": "queue", "Pipeline.connected": "queue",
               "Pipeline.flush": "flush", "Batch.__init__": "flush", "live": "flush",
               "live.<locals>.<listcomp>": "flush", "Pipe.write": "flush",
               "Pipe.write.<locals>.<listcomp>": "flush", "Pipeline.answer": "answer",
               "Batch.answered": "answer", "report_failure": "answer"}


def _compiled_group(name: str) -> str:
    name = re.sub(r"^CPyDunder_am_send", "CPyDef_", name)
    match = _MODULE.match(name)
    module = match.group(1) if match else ""
    if "_holding" in name:
        return "slot"
    if module in ("middleware", "outcome"):
        return "mw"
    if "__hash__" in name and "limits" in name:
        return "hash"
    if module in ("identity", "client_ip", "limit_sets", "route_table", "routes") or (
            name.endswith(("Limiter___charge_now", "Limiter____route",
                           "Limiter____limit_set"))):
        return "key"
    if module in ("headers", "sending") or name.endswith("Limiter____finish"):
        return "hdr"
    if name.endswith(("Packer___release", "Packer___settlements")):
        return "slot"
    if module in ("wire", "packer") and "verdict_from" not in name:
        return "pack"
    if name.endswith("RedisStorage____queue"):
        return "queue"
    if module in ("pipe", "inflight"):
        step = re.sub(r"^.*?(?:pipe|inflight)___", "", name).replace("___", ".")
        if step == "Pipe.data_received":
            return "read"
        return _PIPE_STEPS.get(step, "pipe")
    if module in ("holds", "leases", "disconnects", "lease_ids") or name.endswith((
            "RedisStorage___release_now", "RedisStorage____queue_release",
            "RedisStorage____queue_releases", "RedisStorage____write_now")):
        return "slot"
    if module == "decision" or name.endswith("verdict_from"):
        return "verdict"
    return "decide"


def _python_group(name: str) -> str:
    qualname, _, where = name[3:].partition(" (")
    if "ratelimit_mw/storage/pipe.py" in where or "ratelimit_mw/storage/inflight.py" in where:
        if qualname == "Pipe.data_received":
            return "read"
        return _PIPE_STEPS.get(qualname, "pipe")
    if where.startswith("ratelimit_mw/"):
        return "decide"  # the base storage's decide_now, which Redis declines
    if where.startswith("<string>"):  # made by namedtuple and dataclass at import
        return "hash" if qualname.endswith("__hash__") else "verdict"
    if where.startswith("redis/"):
        return "slot"
    if "_with_constant_headers" in qualname:
        return "hdr"
    if where.startswith(("asyncio/", "_weakrefset.py")):
        return "loop"
    return "rest"


def group(kind: str, name: str) -> str:
    """The group of the named function ``name`` of ``kind`` (see ``_kind``)."""
    if kind == "compiled":
        return _compiled_group(name)
    if kind == "py":
        return _python_group(name)
    return {"hook": "hook", "hiredis": "read", "uvloop": "loop", "asyncio": "loop"}.get(
        kind, "rest")


def _kind(name: str, library: str) -> str | None:
    """What named function ``name`` (in ``library``) is, or None for CPython's own."""
    if name.startswith("py:"):
        return "py"
    if "__mypyc" in library:
        return "compiled" if _COMPILED.match(name) and not _RUNTIME.match(name) else None
    for prefix, kind in (("loop.", "uvloop"), ("_asyncio.", "asyncio"), ("hiredis.", "hiredis"),
                         ("parser.", "httptools"), ("url_parser.", "httptools")):
        if library.startswith(prefix):
            return kind
    return None


def _frames(directory: Path, pid: str) -> dict[str, str]:
    """``pyf_<n>`` -> ``py:qualified name (file:line)``, from the hook's map."""
    names = {}
    for line in (directory / f"map.{pid}").read_text().splitlines():
        n, qualname, file, first = line.split("\t")
        file = re.sub(r"^.*/(site-packages|lib/python3\.\d+|benchmarks|build/compiled)/", "",
                      file)
        names[f"pyf_{n}"] = f"py:{qualname} ({file}:{first})"
    return names


def _records(path: Path) -> Iterator[tuple[str, str, str, int]]:
    """``(kind, library, context, count)`` of each cost line: kind ``self`` (instructions)
    or ``calls`` (calls into the context)."""
    names: dict[tuple[str, str], str] = {}
    library = context = called = ""
    calls = 0
    spec = re.compile(r"^(fn|cfn|ob|cob|fl|fi|fe|cfi|cfl)=\((\d+)\)(?: (.*))?$")
    with path.open() as lines:
        for line in lines:
            match = spec.match(line)
            if match:
                key, ident, name = match.groups()
                table = {"cfn": "fn", "cob": "ob"}.get(key, key)
                if name is not None:
                    names[table, ident] = name.rstrip("\n")
                if key == "fn":
                    context = names["fn", ident]
                elif key == "ob":
                    library = names["ob", ident]
                elif key == "cfn":
                    called = names["fn", ident]
                continue
            if line.startswith("calls="):
                calls = int(line[6:].split()[0])
                continue
            if line[:1].isdigit() or line[:1] in "+-*":
                parts = line.split()
                if len(parts) < 2:
                    continue
                if calls:
                    yield "calls", "", called, calls
                    calls = 0
                else:
                    yield "self", library.rsplit("/", 1)[-1], context, int(parts[1])


def _stack(context: str, frames: dict[str, str]) -> list[str]:
    """The function of a context, then its callers (recursion marks ``'2`` dropped)."""
    out: list[str] = []
    for part in context.split("'"):
        if part.isdigit() and out:
            continue
        out.append(frames.get(part, part))
    return out


_INLINE = ["hook", "_PyEval_Vector", "_PyFunction_Vectorcall", "PyObject_Vectorcall",
           "_PyEval_EvalFrameDefault"]
"""The callers of a Python function called by a Python function's CALL: the calls that
CPython 3.11 runs inline without the hook."""


def owners(path: Path) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
    """Instructions per innermost named function (``(kind, name)``), and calls per
    function (``inline:<group>``: the calls the hook keeps from running inline, per
    group of the function called), over the whole dump."""
    pid = re.search(r"^pid: (\d+)$", path.read_text()[:4096], re.MULTILINE)
    if pid is None:
        msg = f"no pid in {path}"
        raise SystemExit(msg)
    frames = _frames(path.parent, pid.group(1))
    libraries: dict[str, str] = {}
    costs: dict[tuple[str, str], int] = defaultdict(int)
    selfs: list[tuple[list[str], str, int]] = []
    calls: dict[str, int] = defaultdict(int)
    for kind, library, context, count in _records(path):
        stack = _stack(context, frames)
        if kind == "calls":
            calls[stack[0]] += count
            if stack[0].startswith("py:") and stack[1:6] == _INLINE:
                calls[f"inline:{_python_group(stack[0])}"] += count
            continue
        libraries.setdefault(stack[0], library)
        selfs.append((stack, library, count))
    for stack, library, count in selfs:
        if stack[0] == "hook" or library.startswith("_pyframes"):
            costs["hook", "frame hook"] += count
            continue
        for name in stack:
            kind_of = _kind(name, libraries.get(name, ""))
            if kind_of is not None:
                costs[kind_of, name] += count
                break
        else:
            costs["unresolved", stack[-1]] += count
    return dict(costs), dict(calls)


def groups(costs: dict[tuple[str, str], int]) -> dict[str, int]:
    """Instructions per group key."""
    out: dict[str, int] = defaultdict(int)
    for (kind, name), count in costs.items():
        out[group(kind, name)] += count
    return out


def _number(value: float) -> str:
    return f"{round(value, -2):,.0f}".replace(",", " ")


def table(app: str, mine: dict[str, int], control: dict[str, int], requests: int) -> list[str]:
    """The markdown table of ``app`` beside ``headers``, per request."""
    lines = [f"| function group | headers | {app} |", "|---|---:|---:|"]
    for _, label, members in ROWS:
        values = [sum(counts.get(m, 0) for m in members) / requests
                  for counts in (control, mine)]
        if not any(values):
            continue
        cells = " | ".join(_number(v) if v else "" for v in values)
        lines.append(f"| {label} | {cells} |")
    totals = [sum(counts.values()) / requests for counts in (control, mine)]
    lines.append(f"| **total, with the hook** | **{_number(totals[0])}** | "
                 f"**{_number(totals[1])}** |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the --keep directory of instructions.py")
    parser.add_argument("apps", nargs="*", default=["redis", "redis-tier"])
    parser.add_argument("--requests", type=int, default=2000, help="requests counted per app")
    parser.add_argument("--build", default="compiled")
    parser.add_argument("--owners", type=int, default=0,
                        help="also print each app's N costliest functions")
    args = parser.parse_args()
    found = {app: owners(args.directory / f"{app}.{args.build}.callgrind.out")
             for app in ["headers", *args.apps]}
    control = groups(found["headers"][0])
    for app in args.apps:
        costs, calls = found[app]
        print(f"\n{app}:\n")
        print("\n".join(table(app, groups(costs), control, args.requests)))
        per = {name: calls.get(name, 0) / args.requests for name in calls}

        def called(qualname: str, per: dict[str, float] = per) -> float:
            return sum(v for k, v in per.items() if k.startswith(f"py:{qualname} ("))
        unresolved = sum(v for (k, _), v in costs.items() if k == "unresolved")
        inline = {k[7:]: v for k, v in per.items() if k.startswith("inline:")}
        print(f"\nPer request: {called('Pipe.write'):.3f} writes to Redis, "
              f"{called('Pipe.data_received'):.3f} reads, {called('Pipeline.flush'):.3f} "
              f"flushes called; {unresolved / args.requests:.0f} instructions without a "
              f"named function within the callers kept (counted in the rest). Calls the "
              f"hook keeps from running inline, by the called function's group: "
              + ", ".join(f"{k} {v:.1f}" for k, v in sorted(inline.items())))
        for (kind, name), count in sorted(costs.items(), key=lambda item: -item[1])[
                :args.owners]:
            print(f"{count / args.requests:9.0f}  {group(kind, name):7s} {kind:9s} {name}")


if __name__ == "__main__":
    main()
