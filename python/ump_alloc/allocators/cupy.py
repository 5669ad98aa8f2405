"""``ump_cupy_allocator``: ump-alloc's CuPy allocator, like ``rmm.allocators.cupy.rmm_cupy_allocator``.

Usage::

    import cupy
    from ump_alloc.allocators.cupy import ump_cupy_allocator

    cupy.cuda.set_allocator(ump_cupy_allocator)

It is the allocator :func:`ump_alloc.enable` installs: a builtin implemented in the library
where CuPy allows it (no Python per allocation; ``python -m ump_alloc info`` says which), called
as ``ump_cupy_allocator(nbytes) -> cupy.cuda.MemoryPointer``. The block is made for CuPy's
current stream, and CuPy streams are retired in ump-alloc when CuPy destroys them. Getting the
attribute initialises ump-alloc and raises :class:`ump_alloc.UmpError` without a GPU mode.
"""

from __future__ import annotations

__all__ = ["ump_cupy_allocator"]


def __getattr__(name: str):
    if name != "ump_cupy_allocator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import cupy

    from .. import _cupy, _lib
    from .._runtime import mode

    _lib.check(_lib.lib().ump_init(), "ump_init")
    if mode() in ("host", "unset"):
        raise _lib.UmpError(
            f"ump_cupy_allocator needs a GPU mode; ump-alloc runs in mode '{mode()}' "
            "(python -m ump_alloc info says why)",
            _lib.ERR_UNSUPPORTED,
        )
    alloc = _cupy.allocator()
    _cupy._patch_stream_del(cupy)
    return alloc
