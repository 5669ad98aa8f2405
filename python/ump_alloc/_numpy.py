"""NumPy integration: ump-alloc as NumPy's memory handler (NEP 49).

**Routes** (``UMP_ALLOC_NUMPY_ROUTE``). ``native``, the default: the library's own handler
(``ump_numpy_handler``) goes into a ``mem_handler`` capsule made with ``ctypes.pythonapi`` and
is set with ``PyDataMem_SetHandler`` from NumPy's C-API table (the ``_ARRAY_API`` capsule of
``numpy._core._multiarray_umath``, ``numpy.core`` in NumPy 1.x). It needs nothing but NumPy
>= 1.22 and ctypes, so it works on every CPython NumPy has wheels for, free-threaded builds
included. ``numpy_allocator``: the same functions (their context-free ``ump_malloc`` family)
through the ``numpy_allocator`` package, for those who use it; that package has wheels for
CPython 3.9-3.13 only and none for free-threaded builds.

**Threads.** NumPy keeps the current handler in a context variable, and a thread starts from
an empty context: on NumPy's *default* handler, whatever was set elsewhere. So with
``threads=True`` ump-alloc takes the default handler's place (``PyCapsule_SetPointer`` on
NumPy's default capsule, once per process) with its dispatch handler
(``ump_numpy_dispatch_handler``): while enabled, every thread that has not set a handler of its
own allocates from ump-alloc, threads that existed before included (a thread pool made before
``import numpy``, a server's workers); otherwise the dispatch handler calls NumPy's own
functions. Each block is resized and freed by the allocator that made it, so arrays made
before, during and after stay valid. The calling thread also gets ump-alloc's handler set in
its context, as NEP 49 intends.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes

from . import _lib

ROUTES = ("native", "numpy_allocator")

# NumPy's C-API table (numpy/__multiarray_api.h): stable indices since NumPy 1.22.
_GET_FEATURE_VERSION = 211  # unsigned int PyArray_GetNDArrayCFeatureVersion(void)
_SET_HANDLER = 304  # PyObject *PyDataMem_SetHandler(PyObject *)
_GET_HANDLER = 305  # PyObject *PyDataMem_GetHandler(void)
_NPY_1_22_FEATURE_VERSION = 0xF

_capsule = None  # the calling thread's handler (a capsule of the route in use)
_route = None
_previous = []  # handlers to restore, innermost last
_threads_stack = []  # whether each install() reached other threads, innermost last
_dispatch_users = 0  # enable(threads=True) frames in force
_dispatch_installed = False
_api = None
_handler_cls = None

# The capsule name must outlive every capsule (NumPy reads it at each free): kept in a buffer
# whose reference count never drops to zero.
_CAPSULE_NAME = ctypes.create_string_buffer(b"mem_handler")
ctypes.pythonapi.Py_IncRef(ctypes.py_object(_CAPSULE_NAME))

_py = ctypes.pythonapi
_py.PyCapsule_New.restype = ctypes.py_object
_py.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_py.PyCapsule_GetPointer.restype = ctypes.c_void_p
_py.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]
_py.PyCapsule_SetPointer.restype = ctypes.c_int
_py.PyCapsule_SetPointer.argtypes = [ctypes.py_object, ctypes.c_void_p]


class _NumpyApi:
    """``PyDataMem_SetHandler`` and ``PyDataMem_GetHandler`` from NumPy's C-API table."""

    def __init__(self):
        import numpy

        try:
            from numpy._core import _multiarray_umath as umath  # NumPy 2
        except ImportError:
            from numpy.core import _multiarray_umath as umath  # NumPy 1.x
        table = _py.PyCapsule_GetPointer(umath._ARRAY_API, None)
        if not table:
            raise _lib.UmpError("NumPy's C-API table (_ARRAY_API) is empty", _lib.ERR_UNSUPPORTED)
        entries = (ctypes.c_void_p * (_GET_HANDLER + 1)).from_address(table)
        feature = ctypes.PYFUNCTYPE(ctypes.c_uint)(entries[_GET_FEATURE_VERSION])()
        if feature < _NPY_1_22_FEATURE_VERSION:
            raise _lib.UmpError(
                f"NumPy {numpy.__version__} has no memory-handler API (NEP 49 came with NumPy 1.22): "
                "upgrade NumPy (pip install 'numpy>=1.22')",
                _lib.ERR_UNSUPPORTED,
            )
        # PYFUNCTYPE: called with the GIL held, a Python error raised where NumPy sets one; a
        # py_object result takes over the new reference NumPy returns.
        self.set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(entries[_SET_HANDLER])
        self.get_handler = ctypes.PYFUNCTYPE(ctypes.py_object)(entries[_GET_HANDLER])
        self.version = numpy.__version__


def _numpy_api() -> _NumpyApi:
    global _api
    if _api is None:
        _api = _NumpyApi()
    return _api


def route() -> str:
    """The route in use (after the first :func:`install`), else the one configured."""
    if _route is not None:
        return _route
    from . import _config

    try:
        return _config.setting("UMP_ALLOC_NUMPY_ROUTE")
    except _lib.UmpError:
        return "native"  # the library's configuration check refuses the value, and says why


def handler_class():
    """The numpy_allocator handler class over ump_malloc/calloc/realloc/free (made once)."""
    global _handler_cls
    if _handler_cls is None:
        try:
            import numpy_allocator
        except ImportError:
            raise _lib.UmpError(
                "UMP_ALLOC_NUMPY_ROUTE=numpy_allocator, but the numpy_allocator package is not "
                "installed: pip install numpy_allocator (wheels for CPython 3.9-3.13), or unset "
                "UMP_ALLOC_NUMPY_ROUTE to use ump-alloc's own NumPy handler",
                _lib.ERR_UNSUPPORTED,
            ) from None
        lib = _lib.lib()

        class ump_alloc(metaclass=numpy_allocator.type):  # the handler's name in NumPy
            # numpy_allocator wants the address of the ctypes cell that holds each function
            # pointer; `lib` keeps those cells alive for the life of the process.
            _malloc_ = ctypes.addressof(lib.ump_malloc)
            _calloc_ = ctypes.addressof(lib.ump_calloc)
            _realloc_ = ctypes.addressof(lib.ump_realloc)
            _free_ = ctypes.addressof(lib.ump_free)

        _handler_cls = ump_alloc
    return _handler_cls


def capsule():
    """The calling thread's handler capsule for the configured route (made once)."""
    global _capsule, _route
    if _capsule is None:
        r = route()
        if r == "numpy_allocator":
            _capsule = handler_class().handler()
        else:
            _capsule = _py.PyCapsule_New(_lib.lib().ump_numpy_handler(), ctypes.addressof(_CAPSULE_NAME), None)
        _route = r
    return _capsule


def _install_dispatch() -> None:
    """Put the dispatch handler into NumPy's default capsule (once per process)."""
    global _dispatch_installed
    if _dispatch_installed:
        return
    api = _numpy_api()
    default = contextvars.Context().run(api.get_handler)  # an empty context: the default
    current = _py.PyCapsule_GetPointer(default, ctypes.addressof(_CAPSULE_NAME))
    dispatch = _lib.lib().ump_numpy_dispatch_handler(current)
    if not dispatch:
        raise _lib.UmpError(_lib.last_error() or "ump_numpy_dispatch_handler failed", _lib.ERR_INTERNAL)
    if current != dispatch and _py.PyCapsule_SetPointer(default, dispatch) != 0:
        raise _lib.UmpError("cannot take the place of NumPy's default handler", _lib.ERR_INTERNAL)
    _dispatch_installed = True


def _keep_errstate_lookups_cached() -> None:
    """Set NumPy's error state to what it is, in this thread's context.

    Setting the handler puts a ContextVar into the thread's context; from then on NumPy's
    look-up of its error state (another ContextVar, read by every ufunc call) misses the
    interpreter's cache whenever that variable was never set in the context, and walks the
    context's map instead: measured with callgrind, 120 instead of 27 instructions per ufunc
    call, about 1.5 % of a loop of small-array arithmetic (issue 21). Set, it is found and
    cached like the handler. The values do not change."""
    import numpy

    numpy.seterr(**numpy.geterr())


def install(threads: bool = True) -> None:
    """Make ump-alloc NumPy's allocator in this thread and, with ``threads``, in every thread
    that has not set a handler of its own (existing ones too)."""
    global _dispatch_users
    cap = capsule()
    if threads:
        _install_dispatch()
    _previous.append(_set(cap))
    _keep_errstate_lookups_cached()
    if threads:
        _dispatch_users += 1
        _lib.check(_lib.lib().ump_numpy_dispatch_set(True), "ump_numpy_dispatch_set")
    _threads_stack.append(threads)


def _set(handler):
    if _route == "numpy_allocator":
        import numpy_allocator

        return numpy_allocator.set_handler(handler)
    return _numpy_api().set_handler(handler)


def uninstall() -> None:
    """Restore the handler that was current before the matching :func:`install`, and switch
    other threads back to NumPy's own allocator after the last ``threads=True`` one."""
    global _dispatch_users
    prev = _previous.pop() if _previous else _default_handler()
    _set(prev)
    if _threads_stack and _threads_stack.pop():
        _dispatch_users -= 1
        if _dispatch_users == 0:
            _lib.check(_lib.lib().ump_numpy_dispatch_set(False), "ump_numpy_dispatch_set")


@contextlib.contextmanager
def allocating():
    """NumPy allocates from ump-alloc inside the block, in the calling thread, on either route
    (for ump-alloc's own buffers, e.g. PyTorch's ``.cpu()`` into the host side)."""
    prev = _set(capsule())
    try:
        yield
    finally:
        _set(prev)


def _default_handler():
    return contextvars.Context().run(_numpy_api().get_handler)


def _current_handler():
    return _numpy_api().get_handler()


def active() -> bool:
    """Whether NumPy allocates from ump-alloc in this thread."""
    if _capsule is None and not _dispatch_installed:
        return False
    cur = _current_handler()
    if cur is _capsule:
        return True
    return _dispatch_installed and cur is _default_handler() and bool(_lib.lib().ump_numpy_dispatching())


def handles(array) -> bool:
    """Whether ``array``'s memory (or, for a view, the memory of the array it looks into) was
    allocated by ump-alloc. The same before, during and after :func:`ump_alloc.enable`: a NumPy
    array gives a bool, anything else raises TypeError."""
    import numpy

    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"argument must be an ndarray, not {type(array).__name__}")
    owner = array
    while not owner.flags.owndata and isinstance(owner.base, numpy.ndarray):
        owner = owner.base
    if not owner.flags.owndata:
        return False  # the memory of another object (bytes, mmap, a foreign buffer)
    ptr = owner.__array_interface__["data"][0]
    # ump_owns, not ump_identify: it never loads the CUDA driver (a NumPy-only program on plain
    # host memory stays single-threaded, issue 20).
    return bool(_lib.lib().ump_owns(ctypes.c_void_p(ptr)))


def describe() -> list[str]:
    """Lines for ``python -m ump_alloc info``: the route and which threads it reaches."""
    r = route()
    if r == "numpy_allocator":
        how = "through the numpy_allocator package (UMP_ALLOC_NUMPY_ROUTE=numpy_allocator)"
        try:
            import numpy_allocator  # noqa: F401

            import importlib.metadata as md

            how += f", version {md.version('numpy_allocator')}"
        except ImportError:
            how += ", which is NOT installed: enabling fails (pip install numpy_allocator)"
        except Exception:  # noqa: BLE001 - importable, but without distribution metadata
            pass
    else:
        how = "ump-alloc's own (NEP 49, PyDataMem_SetHandler); numpy_allocator not needed"
    lines = [f"NumPy handler: {how}"]
    dispatch = ""
    if _dispatch_installed:
        dispatch = f" (dispatching to ump-alloc: {'yes' if _lib.lib().ump_numpy_dispatching() else 'no'})"
    lines.append(
        "  threads: all, those started before enabling too, through NumPy's default handler"
        f"{dispatch};\n  not a thread that set a NumPy handler of its own; enable(threads=False): the calling thread only"
    )
    return lines
