"""CuPy integration through ``cupy.cuda.CFunctionAllocator``.

CuPy's allocator is a Python callable; CuPy does not check the pointer a C allocator returns (a
NULL would become an array at address 0), and its free passes no stream.

**The fast path** (CuPy exposes ``cupy.cuda.stream.get_current_stream_ptr`` as a C function):
the allocator CuPy calls is ``ump_cupy_allocator``, a builtin implemented in the library (made
here with ``PyCFunction_NewEx``). It calls a ``CFunctionAllocator`` whose ``param`` is
``UMP_CUPY_CURRENT_STREAM``: ump-alloc reads CuPy's current stream in C, makes the block for it,
and frees it into that stream's pool, as CuPy's own pool keys its arenas by stream. Only a
failed allocation runs Python (``_raise_oom``, which raises ``cupy.cuda.memory.OutOfMemoryError``
with ump-alloc's message).

**The fallback** (other CuPy versions): a Python function per allocation, with one
``CFunctionAllocator`` per stream whose ``param`` is the stream's handle.

Either way a block is reused at once on its stream, and on another stream only behind an event.
CuPy streams are retired in ump-alloc just before CuPy destroys them (``Stream.__del__``).
"""

from __future__ import annotations

import ctypes

from . import _lib

_state = {"allocator": None, "previous": None, "installed": False, "stream_del": None, "fast": False}

# The fallback's stream handle -> CFunctionAllocator.malloc whose `param` is that handle.
_by_stream: dict = {}

UMP_CUPY_CURRENT_STREAM = -2
_METH_O = 0x0008


class _PyMethodDef(ctypes.Structure):
    _fields_ = [
        ("ml_name", ctypes.c_char_p),
        ("ml_meth", ctypes.c_void_p),
        ("ml_flags", ctypes.c_int),
        ("ml_doc", ctypes.c_char_p),
    ]


# Kept alive for good: CPython's builtin points at it.
_method_def = _PyMethodDef(
    b"ump_cupy_allocator",
    None,
    _METH_O,
    b"ump_cupy_allocator(size) -> cupy.cuda.MemoryPointer: ump-alloc's CuPy allocator "
    b"(the block is made for CuPy's current stream).",
)


def _out_of_memory(cupy, size: int):
    msg = _lib.last_error() or "ump_cupy_malloc returned NULL"
    try:
        total = cupy.cuda.runtime.memGetInfo()[1]
    except Exception:  # noqa: BLE001 - the message matters, not the total
        total = 0
    err = cupy.cuda.memory.OutOfMemoryError(size, total)
    err.args = (f"{err.args[0] if err.args else ''} ({msg})",)
    return err


def _function_address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


def _capsule_pointer(capsule) -> int:
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(capsule)
    # Cython names the capsule after the C signature: a cpdef taking only skip_dispatch.
    if name is None or not name.startswith(b"intptr_t (") or name.count(b",") > 0:
        return 0
    return api.PyCapsule_GetPointer(capsule, name) or 0


def _make_fast_allocator(cupy):
    """The C-implemented allocator, or None when this CuPy lacks the C function it needs."""
    capi = getattr(getattr(cupy.cuda, "stream", None), "__pyx_capi__", None) or {}
    capsule = capi.get("get_current_stream_ptr")
    if capsule is None:
        return None
    current_stream = _capsule_pointer(capsule)
    if not current_stream:
        return None
    api = ctypes.pythonapi
    lib = _lib.lib()
    rc = lib.ump_cupy_fast_path_init(
        ctypes.c_void_p(_function_address(api.PyObject_CallFunctionObjArgs)),
        ctypes.c_void_p(_function_address(api.Py_DecRef)),
        ctypes.c_void_p(_function_address(api.PyTuple_GetItem)),
        ctypes.c_void_p(current_stream),
    )
    if rc != _lib.OK:
        return None
    malloc_ptr = _function_address(lib.ump_cupy_malloc)
    free_ptr = _function_address(lib.ump_cupy_free)
    c_alloc = cupy.cuda.memory.CFunctionAllocator(UMP_CUPY_CURRENT_STREAM, malloc_ptr, free_ptr, lib)

    def raise_oom(size):
        raise _out_of_memory(cupy, size)

    _method_def.ml_meth = _function_address(lib.ump_cupy_allocator)
    api.PyCFunction_NewEx.restype = ctypes.py_object
    api.PyCFunction_NewEx.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
    return api.PyCFunction_NewEx(ctypes.addressof(_method_def), (c_alloc.malloc, raise_oom), None)


def _make_python_allocator(cupy):
    """The fallback: a Python function per allocation, one CFunctionAllocator per stream."""

    lib = _lib.lib()
    malloc_ptr = ctypes.cast(lib.ump_cupy_malloc, ctypes.c_void_p).value
    free_ptr = ctypes.cast(lib.ump_cupy_free, ctypes.c_void_p).value
    CFunctionAllocator = cupy.cuda.memory.CFunctionAllocator
    get_current_stream = cupy.cuda.get_current_stream
    by_stream = _by_stream

    def ump_cupy_malloc(size):
        s = get_current_stream().ptr
        c_malloc = by_stream.get(s)
        if c_malloc is None:
            c_malloc = by_stream[s] = CFunctionAllocator(s, malloc_ptr, free_ptr, lib).malloc
        mem = c_malloc(size)
        if mem.ptr == 0 and size > 0:  # CuPy hands out size-0 blocks as ptr 0 itself
            raise _out_of_memory(cupy, size)
        return mem

    return ump_cupy_malloc


def allocator():
    """The CuPy allocator over ump-alloc (made once): the C-implemented fast path where CuPy
    allows it, else the Python fallback."""
    if _state["allocator"] is None:
        import cupy

        fast = _make_fast_allocator(cupy)
        _state["fast"] = fast is not None
        _state["allocator"] = fast if fast is not None else _make_python_allocator(cupy)
    return _state["allocator"]


def fast_path() -> bool:
    """Whether CuPy allocates through the C-implemented allocator (no Python per allocation)."""
    allocator()
    return bool(_state["fast"])


def install(zero_copy: bool | None = None) -> None:
    """Make ump-alloc CuPy's allocator; ``zero_copy`` (None: ``UMP_ALLOC_CUPY_ZERO_COPY``)
    also turns on CUPY_ENABLE_UMP's views for ump-alloc memory (see ``_cupy_zerocopy``)."""
    import os

    import cupy

    if zero_copy is None:
        zero_copy = os.environ.get("UMP_ALLOC_CUPY_ZERO_COPY", "").strip() == "1"
    if zero_copy:
        from . import _cupy_zerocopy

        _cupy_zerocopy.install(cupy)
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
            # The fast path does not know which streams it served: retire every stream (a
            # stream ump-alloc never saw costs one lookup).
            if ptr and (_state["fast"] or _by_stream.pop(ptr, None) is not None):
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
    from . import _cupy_zerocopy

    _cupy_zerocopy.uninstall()
    _state["installed"] = False


def active() -> bool:
    return _state["installed"]
