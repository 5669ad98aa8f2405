"""CuPy's copy from a NumPy temporary when its pinned staging buffer cannot be had.

``cupy.asarray``/``cupy.array`` of host data that is not already pinned and laid out as asked
copy it into a pinned staging buffer from CuPy's pinned-memory allocator and send that
asynchronously. When that allocator gives nothing (one set with
``cupy.cuda.set_pinned_memory_allocator`` that returns None or fails), CuPy instead sends a
NumPy temporary with ``copy_from_host_async`` and drops it on return, counting on a copy from
pageable memory having read it by then. Under ump-alloc that temporary is pinned: the copy is a
real asynchronous DMA, and NumPy may reuse the memory before it is read (measured on the H200:
6 of 6 copies corrupted; CuPy's own ``TestAsarray`` with ``pinned_alloc_fails``).

So while an allocator other than CuPy's own is set through ``cupy.cuda.set_pinned_memory_allocator``
(after ump-alloc took CuPy's allocation), ``cupy.asarray`` and ``cupy.array`` default to
``blocking=True``: CuPy synchronises the stream before it returns, while the temporary is still
alive. A caller's own ``blocking=`` is kept. With CuPy's pinned pool (the default, or set back)
nothing changes. Not covered: CuPy's own pool failing for want of host memory (CuPy then warns
``Using synchronous transfer``), which nothing outside CuPy can see coming.
"""

from __future__ import annotations

import functools

_orig: dict = {}


def install(cupy) -> None:
    """Watch which pinned-memory allocator CuPy is given from now on (once)."""
    if _orig:
        return
    _orig.update(set=cupy.cuda.set_pinned_memory_allocator, cupy=cupy)
    cupy.cuda.set_pinned_memory_allocator = _set_pinned_memory_allocator


def uninstall() -> None:
    if not _orig:
        return
    cupy = _orig["cupy"]
    cupy.cuda.set_pinned_memory_allocator = _orig["set"]
    _blocking(cupy, False)
    _orig.clear()


def blocking() -> bool:
    """Whether ``cupy.asarray``/``cupy.array`` default to ``blocking=True`` now."""
    return "asarray" in _orig


def _set_pinned_memory_allocator(allocator=None):
    cupy = _orig["cupy"]
    # None is CuPy's plain cudaHostAlloc; both it and CuPy's pool raise rather than give nothing.
    own = allocator is None or allocator == cupy.get_default_pinned_memory_pool().malloc
    out = _orig["set"](allocator)
    _blocking(cupy, not own)
    return out


def _blocking(cupy, on: bool) -> None:
    if on and "asarray" not in _orig:
        _orig.update(asarray=cupy.asarray, array=cupy.array)
        cupy.asarray = _blocking_by_default(_orig["asarray"])
        cupy.array = _blocking_by_default(_orig["array"])
    elif not on and "asarray" in _orig:
        cupy.asarray, cupy.array = _orig.pop("asarray"), _orig.pop("array")


def _blocking_by_default(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        kwargs.setdefault("blocking", True)
        return fn(*args, **kwargs)

    return call
