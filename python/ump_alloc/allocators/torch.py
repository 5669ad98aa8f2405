"""``ump_torch_allocator``: ump-alloc as a ``torch.cuda.memory.CUDAPluggableAllocator``, like
``rmm.allocators.torch.rmm_torch_allocator``.

Usage (before the first CUDA tensor)::

    import torch
    from ump_alloc.allocators.torch import ump_torch_allocator, attach

    torch.cuda.memory.change_current_allocator(ump_torch_allocator)
    attach()  # record_stream, empty_cache, set_per_process_memory_fraction, OutOfMemoryError

This is the *swap* route: ump-alloc replaces PyTorch's allocator, and the ``torch.cuda`` calls
in ``ump_alloc._torch.SWAP_UNSUPPORTED`` (memory statistics, snapshots, ``cudnn.benchmark``,
CUDA-graph pools, ``MemPool``, CUDA IPC) then raise. Without :func:`attach`,
``record_stream`` is ignored and a failed allocation gives a tensor at address 0.
:func:`ump_alloc.enable` (``torch=True``) takes the *segments* route instead by default (PyTorch
keeps its own caching allocator, ump-alloc supplies its segments, and every ``torch.cuda``
feature works), and is the better choice unless a framework insists on setting the allocator.
"""

from __future__ import annotations

__all__ = ["ump_torch_allocator", "attach"]

_alloc = None


def __getattr__(name: str):
    global _alloc
    if name != "ump_torch_allocator":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _alloc is None:
        import torch

        from .. import _lib

        _alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.library_path(), "ump_torch_malloc", "ump_torch_free")
    return _alloc


def attach() -> None:
    """Attach ump-alloc's hooks to PyTorch's current allocator, which must be
    ``ump_torch_allocator`` (raises :class:`ump_alloc.UmpError` otherwise)."""
    import warnings

    import torch

    from .. import _lib, _torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the error below says it instead
        _torch._attach(torch)
    if not _torch.attached():
        raise _lib.UmpError(
            f"could not attach ump-alloc's hooks to PyTorch's allocator: {_lib.last_error()} "
            "(call torch.cuda.memory.change_current_allocator(ump_torch_allocator) first)",
            _lib.ERR_UNSUPPORTED,
        )
    _torch._state.update(installed=True, route="swap", reason="set by hand (ump_alloc.allocators.torch)")
