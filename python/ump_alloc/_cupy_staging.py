"""CuPy's copy from a NumPy temporary when its pinned staging buffer cannot be had.

``cupy.asarray``/``cupy.array`` of host data that is not already pinned and laid out as asked
copy it into a pinned staging buffer from CuPy's pinned-memory allocator and send that
asynchronously. When that allocator gives nothing (one set with
``cupy.cuda.set_pinned_memory_allocator`` that returns None or fails), CuPy instead sends a
NumPy temporary with ``copy_from_host_async`` and drops it on return, counting on a copy from
pageable memory having read it by then. Under ump-alloc that temporary is pinned: the copy is a
real asynchronous DMA, and NumPy may reuse the memory before it is read (measured on the H200:
6 of 6 copies corrupted; CuPy's own ``TestAsarray`` with ``pinned_alloc_fails``).

So while an allocator other than CuPy's own (its pools' ``malloc``, or None for its plain
``cudaHostAlloc``, which raise rather than give nothing) is set through
``cupy.cuda.set_pinned_memory_allocator`` after ump-alloc took CuPy's allocation,
``cupy.asarray``, ``cupy.asanyarray`` and ``cupy.array`` (and the ``frombuffer``/``fromfile``/
``loadtxt``... family, which calls them) default to ``blocking=True``: CuPy synchronises the
stream before it returns, while the temporary is still alive. A caller's own ``blocking=`` is
kept. The wrappers go in at the first such allocator and stay, reading a switch at each call,
so that other wrappers of the same functions (``_cupy_zerocopy``) stack in any order.

Not covered: CuPy's own pool failing for want of host memory (CuPy warns ``Using synchronous
transfer``), an allocator set before ump-alloc took CuPy's allocation or through
``cupy.cuda.pinned_memory.set_pinned_memory_allocator``, and ``x[...] = numpy_array``, which
CuPy routes through its internal ``array`` directly.
"""

from __future__ import annotations

import functools

_orig: dict = {}
_wrapped: dict = {}  # (id(module), name) -> (module, original, wrapper)
_state = {"blocking": False}
NAMES = ("asarray", "asanyarray", "array")


def install(cupy) -> None:
    """Watch which pinned-memory allocator CuPy is given from now on (once)."""
    if _orig:
        return
    _orig.update(set=cupy.cuda.set_pinned_memory_allocator, cupy=cupy)
    cupy.cuda.set_pinned_memory_allocator = _set_pinned_memory_allocator


def uninstall() -> None:
    """Give CuPy its functions back, each only where it is still the one put there."""
    if not _orig:
        return
    cupy = _orig["cupy"]
    if cupy.cuda.set_pinned_memory_allocator is _set_pinned_memory_allocator:
        cupy.cuda.set_pinned_memory_allocator = _orig["set"]
    for (_, name), (module, original, wrapper) in list(_wrapped.items()):
        if getattr(module, name, None) is wrapper:
            setattr(module, name, original)
    _wrapped.clear()
    _state["blocking"] = False
    _orig.clear()


def blocking() -> bool:
    """Whether ``cupy.asarray``/``cupy.array`` default to ``blocking=True`` now."""
    return _state["blocking"]


def _set_pinned_memory_allocator(allocator=None):
    cupy = _orig["cupy"]
    out = _orig["set"](allocator)
    own = allocator is None or isinstance(getattr(allocator, "__self__", None), cupy.cuda.PinnedMemoryPool)
    if not own:
        _wrap(cupy)
    _state["blocking"] = not own
    return out


def _modules(cupy):
    yield cupy
    from_data = getattr(getattr(cupy, "_creation", None), "from_data", None)
    if from_data is not None:
        yield from_data  # frombuffer, fromfile, loadtxt... call its asarray by its global name


def _wrap(cupy) -> None:
    for module in _modules(cupy):
        for name in NAMES:
            fn = getattr(module, name, None)
            if fn is None or (id(module), name) in _wrapped:
                continue
            wrapper = _blocking_by_default(fn)
            _wrapped[(id(module), name)] = (module, fn, wrapper)
            setattr(module, name, wrapper)


def _blocking_by_default(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if _state["blocking"]:
            kwargs.setdefault("blocking", True)
        return fn(*args, **kwargs)

    return call
