"""Numba integration: an External Memory Management (EMM) plugin, like ``rmm.allocators.numba``.

Use it in one of two ways::

    NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba python program.py

    from numba import cuda
    import ump_alloc.numba
    cuda.set_memory_manager(ump_alloc.numba.UmpNumbaManager)   # before the first CUDA context

Device arrays made by Numba (``cuda.device_array``, ``cuda.to_device``, kernel temporaries)
then come from ump-alloc's device side (managed memory on GPUs without HMM/ATS), the same
memory CuPy and PyTorch get under ump-alloc: ``ump_alloc.identify(arr)`` knows them, and the
host can read them after a synchronisation. Host allocations (``cuda.pinned_array``,
``mapped_array``) stay Numba's own, as with RMM's plugin.

Blocks are allocated for the legacy default stream (Numba's allocation API passes no stream).
Frees go through Numba's deferred-deallocation queue, so ``cuda.defer_cleanup()`` keeps them
alive while it is active, as it does for Numba's own allocator.
"""

from __future__ import annotations

import ctypes as _ctypes
import inspect as _inspect

from numba import config as _config
from numba import cuda as _cuda
from numba.cuda import GetIpcHandleMixin as _GetIpcHandleMixin
from numba.cuda import HostOnlyCUDAMemoryManager as _HostOnly
from numba.cuda import MemoryPointer as _MemoryPointer

from . import _lib

__all__ = ["UmpNumbaManager"]

try:  # the (free, total) named tuple Numba's contexts return
    from numba.cuda.cudadrv.driver import MemoryInfo as _MemoryInfo
except ImportError:  # pragma: no cover - older Numba
    import collections as _collections

    _MemoryInfo = _collections.namedtuple("MemoryInfo", "free,total")

# numba-cuda dropped MemoryPointer's `context` argument in later versions.
_POINTER_TAKES_CONTEXT = "context" in _inspect.signature(_MemoryPointer.__init__).parameters


def _uses_nvidia_binding() -> bool:
    """Whether Numba talks to the driver through NVIDIA's cuda-python bindings (numba-cuda does
    by default) rather than ctypes: device pointers are then ``CUdeviceptr`` objects."""
    import importlib.util

    from numba.cuda.cudadrv import driver as drv

    # The numba-cuda package (numba.cuda's home since Numba 0.61) talks to the driver through
    # NVIDIA's bindings whatever CUDA_USE_NVIDIA_BINDING says (seen with numba-cuda 0.68).
    if importlib.util.find_spec("numba_cuda") is not None:
        return True
    flag = getattr(drv, "USE_NV_BINDING", None)
    if flag is None:
        flag = getattr(_config, "CUDA_USE_NVIDIA_BINDING", False)
    return bool(flag)


def _device_pointer(ptr: int):
    if _uses_nvidia_binding():
        from cuda.bindings.driver import CUdeviceptr

        return CUdeviceptr(ptr)
    return _ctypes.c_uint64(ptr)


class UmpNumbaManager(_GetIpcHandleMixin, _HostOnly):
    """Numba's device memory from ump-alloc (an EMM plugin, interface version 1)."""

    def initialize(self) -> None:
        """Start ump-alloc (its configuration errors surface here, not at the first array)."""
        _lib.check(_lib.lib().ump_init(), "ump_init")

    def _device_id(self) -> int:
        dev = getattr(self.context, "device", None)
        return int(getattr(dev, "id", 0) or 0)

    def memalloc(self, size: int):
        """Allocate ``size`` bytes of device-side memory; raise Numba's out-of-memory error with
        ump-alloc's message when none is left."""
        L = _lib.lib()
        device = self._device_id()
        ptr = L.ump_cupy_malloc(None, int(size), device)
        if not ptr and size:
            # Numba's own allocator flushes its pending frees and tries again; so do we.
            self.deallocations.clear()
            ptr = L.ump_cupy_malloc(None, int(size), device)
        if not ptr and size:
            from numba.cuda.cudadrv.driver import CudaAPIError

            # 2 = CUDA_ERROR_OUT_OF_MEMORY, what Numba's own allocator raises.
            raise CudaAPIError(2, f"ump-alloc could not allocate {size} bytes: {_lib.last_error()}")
        deallocations = self.deallocations
        free = L.ump_cupy_free

        def release(handle, device=device):
            free(None, _ctypes.c_void_p(handle), device)

        def finalizer(ptr=ptr, size=size):
            # Through Numba's queue (add_item(dtor, handle, size)): cuda.defer_cleanup() holds
            # it back, as for Numba's own allocations.
            deallocations.add_item(release, ptr, size=size)

        args = (self.context,) if _POINTER_TAKES_CONTEXT else ()
        return _MemoryPointer(*args, _device_pointer(ptr), size, finalizer=finalizer)

    def get_memory_info(self):
        """(free, total) bytes: the driver's free memory plus what ump-alloc caches on the
        device (ready for reuse), and the device's memory."""
        free, total = _ctypes.c_size_t(), _ctypes.c_size_t()
        _lib.check(
            _lib.lib().ump_device_memory_info(self._device_id(), _ctypes.byref(free), _ctypes.byref(total)),
            "ump_device_memory_info",
        )
        return _MemoryInfo(free=int(free.value), total=int(total.value))

    @property
    def interface_version(self) -> int:
        return 1


# What NUMBA_CUDA_MEMORY_MANAGER=ump_alloc.numba looks for.
_numba_memory_manager = UmpNumbaManager


def use() -> None:
    """``numba.cuda.set_memory_manager(UmpNumbaManager)``: call before Numba makes a context."""
    _cuda.set_memory_manager(UmpNumbaManager)
