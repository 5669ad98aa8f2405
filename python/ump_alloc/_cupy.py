"""CuPy integration through ``cupy.cuda.CFunctionAllocator``.

CuPy does not check the pointer a C allocator returns: a NULL would become an array at address
0. The allocator installed here therefore wraps CFunctionAllocator and raises
``cupy.cuda.memory.OutOfMemoryError`` (with ump-alloc's message) when NULL comes back.

Stream order: CuPy's free passes no stream. The allocator keeps one CFunctionAllocator per
stream, with the stream's handle as its ``param``, and allocates through the one of CuPy's
current stream (as CuPy's own pool keys its arenas by the current stream). ump-alloc then
reuses a freed block at once on that stream, and on another stream only behind an event.
"""

from __future__ import annotations

import ctypes

from . import _lib

_state = {"allocator": None, "previous": None, "installed": False, "stream_del": None}

# Stream handle -> CFunctionAllocator.malloc whose `param` is that handle: the streams ump-alloc
# has allocated on. CuPy streams are retired before they are destroyed (and dropped from here),
# so that blocks freed later never touch a dead handle.
_by_stream: dict = {}


def _make_allocator():
    import cupy

    lib = _lib.lib()
    malloc_ptr = ctypes.cast(lib.ump_cupy_malloc, ctypes.c_void_p).value
    free_ptr = ctypes.cast(lib.ump_cupy_free, ctypes.c_void_p).value
    CFunctionAllocator = cupy.cuda.memory.CFunctionAllocator
    OutOfMemoryError = cupy.cuda.memory.OutOfMemoryError
    get_current_stream = cupy.cuda.get_current_stream
    by_stream = _by_stream

    def ump_cupy_malloc(size):
        s = get_current_stream().ptr
        c_malloc = by_stream.get(s)
        if c_malloc is None:
            c_malloc = by_stream[s] = CFunctionAllocator(s, malloc_ptr, free_ptr, lib).malloc
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
    _patch_stream_del(cupy)
    _state["installed"] = True


def _patch_stream_del(cupy) -> None:
    """Retire a CuPy stream in ump-alloc just before CuPy destroys it (Stream.__del__)."""
    Stream = cupy.cuda.Stream
    if _state["stream_del"] is not None or not hasattr(Stream, "__del__"):
        return
    original = Stream.__del__
    retire = _lib.lib().ump_stream_retire

    def __del__(self, *args, **kwargs):
        try:
            ptr = self.ptr
            if _by_stream.pop(ptr, None) is not None:
                retire(int(getattr(self, "device_id", -1)), ctypes.c_void_p(ptr))
        except Exception:  # noqa: BLE001 - a finaliser must not raise
            pass
        original(self, *args, **kwargs)

    Stream.__del__ = __del__
    _state["stream_del"] = original


def uninstall() -> None:
    if not _state["installed"]:
        return
    import cupy

    cupy.cuda.set_allocator(_state["previous"])
    _state["installed"] = False


def active() -> bool:
    return _state["installed"]
