"""``UmpNumbaManager``: ump-alloc's Numba EMM plugin, like ``rmm.allocators.numba.RMMNumbaManager``.

Usage (before Numba makes a CUDA context)::

    from numba import cuda
    from ump_alloc.allocators.numba import UmpNumbaManager

    cuda.set_memory_manager(UmpNumbaManager)

or ``NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba`` in the environment.
"""

from __future__ import annotations

__all__ = ["UmpNumbaManager"]


def __getattr__(name: str):
    if name != "UmpNumbaManager":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..numba import UmpNumbaManager

    return UmpNumbaManager
