"""CuPy integration through ``cupy.cuda.CFunctionAllocator``.

CuPy does not check the pointer a C allocator returns: a NULL would become an array at address
0. The allocator installed here therefore wraps CFunctionAllocator and raises
``cupy.cuda.memory.OutOfMemoryError`` (with ump-alloc's message) when NULL comes back.
"""

from __future__ import annotations

import ctypes

from . import _lib

_state = {"allocator": None, "previous": None, "installed": False}


def _make_allocator():
    import cupy

    lib = _lib.lib()
    malloc_ptr = ctypes.cast(lib.ump_cupy_malloc, ctypes.c_void_p).value
    free_ptr = ctypes.cast(lib.ump_cupy_free, ctypes.c_void_p).value
    cfa = cupy.cuda.memory.CFunctionAllocator(0, malloc_ptr, free_ptr, lib)
    c_malloc = cfa.malloc
    OutOfMemoryError = cupy.cuda.memory.OutOfMemoryError

    def ump_cupy_malloc(size):
        mem = c_malloc(size)
        if mem.ptr == 0 and size > 0:  # CuPy hands out size-0 blocks as ptr 0 itself
            msg = _lib.last_error() or "ump_cupy_malloc returned NULL"
            try:
                total = cupy.cuda.runtime.memGetInfo()[1]
            except Exception:
                total = 0
            err = OutOfMemoryError(size, total)
            err.args = (f"{err.args[0] if err.args else ''} ({msg})",)
            raise err
        return mem

    return ump_cupy_malloc


def allocator():
    """The CuPy allocator function over ump-alloc (made once)."""
    if _state["allocator"] is None:
        _state["allocator"] = _make_allocator()
    return _state["allocator"]


def install() -> None:
    import cupy

    if _state["installed"]:
        return
    _state["previous"] = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(allocator())
    _state["installed"] = True


def uninstall() -> None:
    if not _state["installed"]:
        return
    import cupy

    cupy.cuda.set_allocator(_state["previous"])
    _state["installed"] = False


def active() -> bool:
    return _state["installed"]
