"""Build a frame hook that lets callgrind name interpreted Python functions.

callgrind sees every interpreted function as CPython's one ``_PyEval_EvalFrameDefault``.
This builds ``build/frames/``: a C extension, ``_pyframes``, whose PEP 523 frame hook
runs each code object's frames through a C function of its own (``pyf_<n>``), and a
``sitecustomize.py`` that installs it in a process started with ``$BENCH_APP`` (the
server ``instructions.py`` starts, not the script itself) when ``$PYFRAMES_MAP`` is
set. The hook appends ``<n>, qualified name, file, first line`` to
``$PYFRAMES_MAP.<pid>`` as it meets each code object; ``instruction_groups.py`` reads it
beside the dump and names ``pyf_<n>`` after the function.

    python benchmarks/frames.py        # prints the directory to put on PYTHONPATH

The hook costs about 40 instructions per frame run (its own row in
``instruction_groups.py``), and with it CPython 3.11 no longer runs a Python-to-Python
call inline in the caller's evaluation loop: such a call costs about 250 instructions
more, counted in the caller's and the callee's rows. CPython 3.11 only (the frame's
layout is internal). Needs a C compiler and Python's headers.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

SLOTS = 16384
"""Code objects named; any beyond share ``pyf_<SLOTS>``."""
OUT = Path(__file__).resolve().parent.parent / "build" / "frames"

_HEAD = r"""
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1
#include <Python.h>
#include "internal/pycore_frame.h"
#include <stdio.h>

typedef PyObject *(*eval_t)(PyThreadState *, _PyInterpreterFrame *, int);
static Py_ssize_t extra_index = -1;
static long used = 0;
static FILE *map = NULL;
"""

# One function per code object: noinline, no tail call and a distinct body each, so
# that the compiler neither merges them nor jumps past them.
_SLOT = ('__attribute__((noinline, used)) PyObject *pyf_{n}(PyThreadState *ts, '
         '_PyInterpreterFrame *f, int t) {{ PyObject *r = _PyEval_EvalFrameDefault(ts, f, t); '
         '__asm__ volatile("" : : "r"({n}) : "memory"); return r; }}\n')

_TAIL = r"""
static intptr_t assign(PyCodeObject *co) {
    if (used >= SLOTS) return SLOTS + 1;
    intptr_t n = ++used;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (_PyCode_SetExtra((PyObject *)co, extra_index, (void *)n) < 0) PyErr_Clear();
    const char *name = PyUnicode_AsUTF8(co->co_qualname);
    if (!name) { PyErr_Clear(); name = "?"; }
    const char *file = PyUnicode_AsUTF8(co->co_filename);
    if (!file) { PyErr_Clear(); file = "?"; }
    fprintf(map, "%ld\t%s\t%s\t%d\n", (long)(n - 1), name, file, co->co_firstlineno);
    fflush(map);
    PyErr_Restore(type, value, tb);
    return n;
}

static PyObject *hook(PyThreadState *ts, _PyInterpreterFrame *f, int t) {
    void *x = NULL;
    if (_PyCode_GetExtra((PyObject *)f->f_code, extra_index, &x) < 0) x = NULL;
    intptr_t n = (intptr_t)x;
    if (n == 0) n = assign(f->f_code);
    return slots[n - 1](ts, f, t);
}

static PyObject *install(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    map = fopen(path, "w");
    if (!map) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
    extra_index = _PyEval_RequestCodeExtraIndex(NULL);
    if (extra_index < 0) return NULL;
    _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(), hook);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"install", install, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pyframes", NULL, -1, methods};
PyMODINIT_FUNC PyInit__pyframes(void) { return PyModule_Create(&module); }
"""

_SITECUSTOMIZE = '''\
"""Installs the frame hook of benchmarks/frames.py in the benchmark's server."""

import os

if os.environ.get("PYFRAMES_MAP") and os.environ.get("BENCH_APP"):
    import _pyframes

    os.makedirs(os.path.dirname(os.path.abspath(os.environ["PYFRAMES_MAP"])), exist_ok=True)
    _pyframes.install(f"{os.environ['PYFRAMES_MAP']}.{os.getpid()}")
'''


def build(out: Path = OUT) -> Path:
    """Write and compile the hook and its ``sitecustomize.py`` into ``out``."""
    if sys.version_info[:2] != (3, 11):
        msg = f"the frame hook reads CPython 3.11's frames, not {sys.version.split()[0]}'s"
        raise SystemExit(msg)
    out.mkdir(parents=True, exist_ok=True)
    source = out / "_pyframes.c"
    slots = "".join(_SLOT.format(n=n) for n in range(SLOTS + 1))
    table = ("static const eval_t slots[] = {"
             + ",".join(f"pyf_{n}" for n in range(SLOTS + 1)) + "};\n")
    source.write_text(f"#define SLOTS {SLOTS}\n{_HEAD}{slots}{table}{_TAIL}")
    target = out / f"_pyframes{sysconfig.get_config_var('EXT_SUFFIX')}"
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-g", "-fno-ipa-icf",
                    "-fno-optimize-sibling-calls", "-I", sysconfig.get_paths()["include"],
                    str(source), "-o", str(target)], check=True)
    (out / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    return out


if __name__ == "__main__":
    print(build())
