"""Several worker processes serving one app (uvicorn ``--workers``, gunicorn), found on
Linux by ``/proc``: a storage of one process is then one storage per worker.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
from pathlib import Path

__all__ = ["claim_group_warning", "sibling_workers"]

_MANAGERS = (b"uvicorn", b"gunicorn")
_PROC = Path("/proc")
# Processes of multiprocessing's own a manager may have beside its workers.
_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def _stat(pid: int | str) -> tuple[int, str] | None:
    """The parent pid and start time (clock ticks since boot) of process ``pid``."""
    try:
        text = (_PROC / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after "pid (command name)"
    return (int(fields[1]), fields[19]) if len(fields) > 19 else None


def _under_manager(parent: int) -> bool:
    """True when ``parent`` is a uvicorn or gunicorn process manager, or this process is
    a ``multiprocessing`` worker (``uvicorn.run(..., workers=2)`` from a script)."""
    try:
        cmdline = (_PROC / str(parent) / "cmdline").read_bytes()
    except OSError:
        return False
    return any(name in cmdline for name in _MANAGERS) or (
        multiprocessing.parent_process() is not None)


def sibling_workers() -> int:
    """How many worker processes of this one's manager run the same program, this one
    included: 1 outside a uvicorn or gunicorn manager, or where ``/proc`` is missing."""
    parent = os.getppid()
    if not _under_manager(parent):
        return 1
    try:
        program = os.readlink("/proc/self/exe")
    except OSError:
        return 1
    count = 0
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _stat(entry.name)
        if stat is None or stat[0] != parent:
            continue
        with contextlib.suppress(OSError):
            if (os.readlink(entry / "exe") == program
                    and not any(helper in (entry / "cmdline").read_bytes()
                                for helper in _HELPERS)):
                count += 1
    return max(count, 1)


def claim_group_warning(topic: str) -> bool:
    """True for the first process of this manager's group to ask about ``topic``, False
    for the others (and for the workers that replace them): a file named after the
    manager's pid and start time, made exclusively, says who came first."""
    parent = os.getppid()
    stat = _stat(parent)
    started = stat[1] if stat is not None else "0"
    name = f"ratelimit_mw-{topic}-{os.getuid()}-{parent}-{started}"
    try:
        os.close(os.open(Path(tempfile.gettempdir()) / name,
                         os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True  # no shared directory: rather a warning per worker than none
    return True
