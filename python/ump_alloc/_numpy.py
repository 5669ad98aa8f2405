"""NumPy integration through numpy_allocator (NEP 49 handlers).

NumPy keeps the current handler in a ContextVar, so a handler set in one thread does not reach
threads started later. ``install`` therefore also wraps ``threading.Thread._bootstrap_inner`` so
that every thread started through :mod:`threading` while ump-alloc is enabled begins on it.
"""

from __future__ import annotations

import ctypes
import threading

from . import _lib

_handler_cls = None
_capsule = None
_previous = []  # handlers to restore, innermost last
_thread_hook_on = False
_orig_bootstrap = None


def handler_class():
    """The numpy_allocator handler class over ump_malloc/calloc/realloc/free (made once)."""
    global _handler_cls
    if _handler_cls is None:
        import numpy_allocator

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
    global _capsule
    if _capsule is None:
        _capsule = handler_class().handler()
    return _capsule


def _set(handler):
    import numpy_allocator

    return numpy_allocator.set_handler(handler)


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
    """Make ump-alloc NumPy's allocator in this thread (and, with ``threads``, new threads)."""
    _previous.append(_set(capsule()))
    _keep_errstate_lookups_cached()
    if threads:
        _hook_threads()


def uninstall() -> None:
    """Restore the handler that was current before the matching :func:`install`."""
    import numpy_allocator

    prev = _previous.pop() if _previous else numpy_allocator.default_handler
    _set(prev)
    if not _previous:
        _unhook_threads()


def active() -> bool:
    """Whether ump-alloc is NumPy's allocator in this thread."""
    import numpy_allocator

    return _capsule is not None and numpy_allocator.get_handler() is _capsule


def handles(array) -> bool:
    """Whether ``array``'s memory (or its base's, for views) was allocated by ump-alloc. The
    same before, during and after :func:`ump_alloc.enable`: a NumPy array gives a bool, anything
    else raises TypeError (as numpy_allocator's ``handles`` does)."""
    import numpy

    if not isinstance(array, numpy.ndarray):
        raise TypeError(f"argument must be an ndarray, not {type(array).__name__}")
    if _handler_cls is None:
        return False  # no array can be ours before the handler exists
    return bool(handler_class().handles(array))


def _hook_threads() -> None:
    global _thread_hook_on, _orig_bootstrap
    if _thread_hook_on or not hasattr(threading.Thread, "_bootstrap_inner"):
        return
    _orig_bootstrap = threading.Thread._bootstrap_inner

    def _bootstrap_inner(self, _orig=_orig_bootstrap):
        if _thread_hook_on:
            try:
                _set(capsule())
                _keep_errstate_lookups_cached()
            except Exception:  # never break thread start-up
                pass
        return _orig(self)

    threading.Thread._bootstrap_inner = _bootstrap_inner
    _thread_hook_on = True


def _unhook_threads() -> None:
    global _thread_hook_on
    if _thread_hook_on and _orig_bootstrap is not None:
        threading.Thread._bootstrap_inner = _orig_bootstrap
    _thread_hook_on = False
