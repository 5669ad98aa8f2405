"""Run at interpreter start by ump_alloc.pth when UMP_ALLOC is set to a true value.

Nothing is imported here: NumPy, CuPy and PyTorch are each switched over the moment the
program imports them (for PyTorch, that is before its first CUDA tensor). A configuration the
machine cannot satisfy (say UMP_ALLOC_MODE=system without HMM) raises UmpError from that
import: ump-alloc never silently runs in another mode than the one asked for.
"""

import os


def _truthy(v):
    return v.strip().lower() in ("1", "true", "yes", "on")


def _enable(**libs):
    import ump_alloc

    ump_alloc._enable_auto(**{"numpy": False, "cupy": False, "torch": False, **libs})


def run():
    if not _truthy(os.environ.get("UMP_ALLOC", "")):
        return
    from . import _hooks

    _hooks.when_imported("numpy", lambda _m: _enable(numpy=True))
    _hooks.when_imported("cupy", lambda _m: _enable(cupy=None))
    _hooks.when_imported("torch", lambda _m: _enable(torch=None))


run()
