"""PyTorch integration through ``torch.cuda.memory.CUDAPluggableAllocator``.

PyTorch accepts a pluggable allocator only before its CUDA caching allocator has served a
tensor; after that ``change_current_allocator`` fails and there is no way back. It also cannot
be uninstalled: ``disable()`` leaves PyTorch on ump-alloc.
"""

from __future__ import annotations

from . import _lib

_state = {"installed": False}


class TooLateError(_lib.UmpError):
    """PyTorch already made CUDA tensors with its own allocator."""


def install() -> None:
    if _state["installed"]:
        return
    import torch

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


def active() -> bool:
    return _state["installed"]
