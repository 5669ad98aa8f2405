"""PyTorch integration through ``torch.cuda.memory.CUDAPluggableAllocator``.

PyTorch accepts a pluggable allocator only before its CUDA caching allocator has served a
tensor; after that ``change_current_allocator`` fails and there is no way back. It also cannot
be uninstalled: ``disable()`` leaves PyTorch on ump-alloc.

Once installed, ump-alloc attaches to the pluggable allocator (``ump_torch_attach``) to give it
what PyTorch's native allocator has and the pluggable one lacks:

- ``tensor.record_stream(s)``: the block is reused only after the work queued on ``s`` until
  its free (events, as PyTorch's caching allocator does);
- ``torch.cuda.empty_cache()`` gives back what ump-alloc caches on the device side;
- ``torch.cuda.set_per_process_memory_fraction(f, device)`` becomes a limit on the device side;
- a failed allocation raises ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``) with
  ump-alloc's message, after everything cached on every stream was given back and the
  allocation tried again, instead of a tensor at address 0.
"""

from __future__ import annotations

import ctypes
import os
import warnings

from . import _lib

_state: dict = {"installed": False, "attached": False, "oom_error": False}


class TooLateError(_lib.UmpError):
    """PyTorch already made CUDA tensors with its own allocator."""


def install(fast_cpu: bool | None = None, unified: bool | None = None) -> None:
    """Make ump-alloc PyTorch's CUDA allocator, attach its hooks, and set up the transfers
    (``fast_cpu``/``unified``; None: ``UMP_ALLOC_TORCH_FAST_CPU``/``UMP_ALLOC_TORCH_UNIFIED``)."""
    import torch

    if _state["installed"]:
        from . import _torch_transfer

        _torch_transfer.install(torch, fast_cpu=fast_cpu, unified=unified)
        return

    if not torch.cuda.is_available():
        raise _lib.UmpError("PyTorch sees no CUDA device", _lib.ERR_UNSUPPORTED)
    path = _lib.library_path()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "ump_torch_malloc", "ump_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise TooLateError(
            "too late to switch PyTorch to ump-alloc: PyTorch's CUDA allocator is already in use "
            "(a CUDA tensor was made before ump_alloc.enable()). Call ump_alloc.enable() before "
            "the first CUDA tensor, or set UMP_ALLOC=1 in the environment. "
            f"PyTorch said: {e}",
            _lib.ERR_LOCKED,
        ) from e
    _state["installed"] = True
    _state["allocator"] = alloc
    _attach(torch)
    from . import _torch_transfer

    _torch_transfer.install(torch, fast_cpu=fast_cpu, unified=unified)


def _libtorch_cuda(torch) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib", "libtorch_cuda.so")


def _attach(torch) -> None:
    """Give PyTorch's pluggable allocator its hooks and a real out-of-memory error."""
    oom = ctypes.c_int(-1)
    rc = _lib.lib().ump_torch_attach(_libtorch_cuda(torch).encode(), ctypes.byref(oom))
    if rc != _lib.OK:
        warnings.warn(
            "ump-alloc could not attach to PyTorch's pluggable allocator "
            f"({_lib.last_error()}): tensor.record_stream() is ignored (a block used on a side "
            "stream may be reused while that stream still reads it: synchronise the side stream "
            "before freeing), torch.cuda.empty_cache() and set_per_process_memory_fraction() do "
            "nothing, and an allocation failure makes a tensor at address 0. Use ump_alloc.trim() "
            "and UMP_ALLOC_LIMIT instead, or report your PyTorch version.",
            RuntimeWarning,
            stacklevel=4,
        )
        return
    _state["attached"] = True
    _state["oom_error"] = oom.value == 1


def active() -> bool:
    return _state["installed"]


def attached() -> bool:
    """Whether PyTorch's allocator has ump-alloc's hooks (record_stream, empty_cache, the
    memory fraction, out-of-memory errors)."""
    return _state["attached"]
