"""CuPy integration through ``cupy.cuda.CFunctionAllocator``.

CuPy's allocator is a Python callable; CuPy does not check the pointer a C allocator returns (a
NULL would become an array at address 0), and its free passes no stream.

**The fast path** (CuPy exports ``get_current_stream_ptr`` as a C function, through Cython's
``__pyx_capi__``; ``cupy_backends.cuda.stream``'s is taken before ``cupy.cuda.stream``'s, which
only forwards to it after one more thread-local lookup): the allocator CuPy calls is a builtin
implemented in the library (made here with ``PyCFunction_NewEx``), with a ``param`` of
``UMP_CUPY_CURRENT_STREAM``: ump-alloc reads CuPy's current stream in C, makes the block for it,
and frees it into that stream's pool, as CuPy's own pool keys its arenas by stream.

- ``ump_cupy_allocator_direct`` (when CuPy also exports ``cupy.cuda.device.get_device_id``):
  makes ``MemoryPointer(CFunctionAllocatorMemory(size, param, malloc, free, device), 0)`` itself,
  what ``CFunctionAllocator.malloc`` does, without that bound-method call and its two new
  Python ints per allocation.
- ``ump_cupy_allocator`` otherwise: calls a ``CFunctionAllocator``'s bound ``malloc``.

Only a failed allocation runs Python (``raise_oom``, which raises
``cupy.cuda.memory.OutOfMemoryError`` with ump-alloc's message).

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


# Kept alive for good: CPython's builtins point at them.
_method_defs: dict = {}
_DOC = (
    b"ump_cupy_allocator(size) -> cupy.cuda.MemoryPointer: ump-alloc's CuPy allocator "
    b"(the block is made for CuPy's current stream)."
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


def _capsule_pointer(capsule, names) -> int:
    """The C function in a Cython ``__pyx_capi__`` capsule whose name (Cython names it after
    the C signature) is one of ``names``; 0 otherwise."""
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    try:
        name = api.PyCapsule_GetName(capsule)
    except Exception:  # noqa: BLE001 - not a capsule
        return 0
    if name not in names:
        return 0
    return api.PyCapsule_GetPointer(capsule, name) or 0


# A cdef function of no argument, or a cpdef one (its C function takes the skip_dispatch flag).
_STREAM_SIGS = (b"intptr_t (void)", b"intptr_t (int __pyx_skip_dispatch)")
_DEVICE_SIGS = (b"int (void)", b"int (int __pyx_skip_dispatch)")


def _capi_function(module_name: str, fn: str, names) -> int:
    import importlib

    try:
        capi = getattr(importlib.import_module(module_name), "__pyx_capi__", None) or {}
    except Exception:  # noqa: BLE001 - another CuPy layout
        return 0
    capsule = capi.get(fn)
    return 0 if capsule is None else _capsule_pointer(capsule, names)


def _current_stream_function() -> int:
    """CuPy's C function for the current stream: cupy_backends' (what cupy.cuda.stream's
    forwards to, one thread-local lookup fewer), else cupy.cuda.stream's; 0 if neither."""
    return _capi_function("cupy_backends.cuda.stream", "get_current_stream_ptr", _STREAM_SIGS) or _capi_function(
        "cupy.cuda.stream", "get_current_stream_ptr", _STREAM_SIGS
    )


def _init_c_api(cupy) -> str | None:
    """Hand CPython's and CuPy's C functions to the library; returns None, or why not."""
    if _state.get("c_api") is not None:
        return _state["c_api"] or None
    stream_fn = _current_stream_function()
    why = None
    if not stream_fn:
        why = "CuPy exports no get_current_stream_ptr C function"
    else:
        api = ctypes.pythonapi
        device_fn = _capi_function("cupy.cuda.device", "get_device_id", _DEVICE_SIGS)
        long_fn = _function_address(api.PyLong_FromLong) if device_fn else 0
        rc = _lib.lib().ump_cupy_fast_path_init(
            ctypes.c_void_p(_function_address(api.PyObject_CallFunctionObjArgs)),
            ctypes.c_void_p(_function_address(api.Py_DecRef)),
            ctypes.c_void_p(_function_address(api.PyTuple_GetItem)),
            ctypes.c_void_p(stream_fn),
            ctypes.c_void_p(long_fn),
            ctypes.c_void_p(device_fn),
        )
        if rc != _lib.OK:
            why = f"ump_cupy_fast_path_init: {_lib.last_error()}"
        else:
            _state["direct_ok"] = bool(device_fn)
    _state["c_api"] = why or ""
    return why


def _builtin(fn_name: bytes, self_tuple):
    """A Python builtin (``PyCFunction_NewEx``) over the library's function ``fn_name``."""
    api = ctypes.pythonapi
    md = _method_defs.get(fn_name)
    if md is None:
        md = _method_defs[fn_name] = _PyMethodDef(
            fn_name, _function_address(getattr(_lib.lib(), fn_name.decode())), _METH_O, _DOC
        )
    api.PyCFunction_NewEx.restype = ctypes.py_object
    api.PyCFunction_NewEx.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
    return api.PyCFunction_NewEx(ctypes.addressof(md), self_tuple, None)


def _make_fast_allocator(cupy, direct: bool | None = None):
    """The C-implemented allocator, or None when this CuPy lacks the C functions it needs.
    ``direct`` (None: when possible) makes CuPy's objects in the library
    (``ump_cupy_allocator_direct``) instead of calling ``CFunctionAllocator.malloc``."""
    why = _init_c_api(cupy)
    if why is not None:
        _state["why_not_fast"] = why
        return None
    lib = _lib.lib()
    malloc_ptr = _function_address(lib.ump_cupy_malloc)
    free_ptr = _function_address(lib.ump_cupy_free)

    def raise_oom(size):
        raise _out_of_memory(cupy, size)

    mem = cupy.cuda.memory
    if direct is None:
        direct = _state.get("direct_ok", False) and hasattr(mem, "CFunctionAllocatorMemory")
    if direct:
        # What CFunctionAllocator.malloc does, with the ints made once (the library's functions
        # stay alive: _lib keeps the library loaded for good).
        t = (raise_oom, mem.CFunctionAllocatorMemory, mem.MemoryPointer, UMP_CUPY_CURRENT_STREAM, malloc_ptr, free_ptr, 0)
        return _builtin(b"ump_cupy_allocator_direct", t)
    c_alloc = mem.CFunctionAllocator(UMP_CUPY_CURRENT_STREAM, malloc_ptr, free_ptr, lib)
    return _builtin(b"ump_cupy_allocator", (c_alloc.malloc, raise_oom))


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
    allows it, else the Python fallback (``describe()`` and ``python -m ump_alloc info`` say
    which, and why)."""
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


def describe() -> str:
    """Which CuPy allocator ump-alloc uses (or would use) with this CuPy, and why."""
    a = allocator()
    if not _state["fast"]:
        return f"Python fallback ({_state.get('why_not_fast')})"
    return f"C fast path ({a.__name__}: no Python per allocation)"


def install(zero_copy: bool | None = None) -> None:
    """Make ump-alloc CuPy's allocator; ``zero_copy`` (None: ``UMP_ALLOC_CUPY_ZERO_COPY``)
    also turns on CUPY_ENABLE_UMP's views for ump-alloc memory (see ``_cupy_zerocopy``)."""
    import cupy

    from . import _config

    if zero_copy is None:
        zero_copy = _config.setting("UMP_ALLOC_CUPY_ZERO_COPY") == "1"
    if zero_copy:
        from . import _cupy_zerocopy

        _cupy_zerocopy.install(cupy)
    if _state["installed"]:
        return
    _state["previous"] = cupy.cuda.get_allocator()
    cupy.cuda.set_allocator(allocator())
    _patch_stream_del(cupy)
    from . import _cupy_staging

    _cupy_staging.install(cupy)
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
    from . import _cupy_staging, _cupy_zerocopy

    _cupy_staging.uninstall()  # first: it may have wrapped the zero-copy asarray
    _cupy_zerocopy.uninstall()
    _state["installed"] = False


def active() -> bool:
    return _state["installed"]
