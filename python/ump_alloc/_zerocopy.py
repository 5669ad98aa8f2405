"""Zero-copy views between NumPy and CuPy / PyTorch, made safe by a stream synchronisation
(``ump_host_access``) or a stream-ordered prefetch (``ump_device_access``) instead of a copy.

A zero-copy result is a view: its ``.base`` is a :class:`ZeroCopyBuffer` that keeps the source
alive. A copy owns its data (``.base is None`` for NumPy results). ``is_zero_copy(a, b)`` tells
whether two arrays share memory.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import _lib


class ZeroCopyBuffer:
    """Exposes another library's memory through the array interfaces, keeping it alive."""

    def __init__(self, owner, ptr, shape, typestr, strides, readonly=False, cuda=False, stream=None):
        self.owner = owner
        iface = {
            "data": (ptr, readonly),
            "shape": tuple(shape),
            "typestr": typestr,
            "strides": tuple(strides) if strides is not None else None,
            "version": 3,
        }
        if cuda:
            iface["stream"] = None  # synchronised already (ump_device_access orders the stream)
            self.__cuda_array_interface__ = iface
        else:
            self.__array_interface__ = iface


def _span(ptr, shape, strides, itemsize):
    """(start, nbytes) of the bytes an array with these strides touches."""
    if any(s == 0 for s in shape):
        return ptr, 0
    lo = hi = 0
    for n, st in zip(shape, strides):
        if st >= 0:
            hi += (n - 1) * st
        else:
            lo += (n - 1) * st
    return ptr + lo, hi - lo + itemsize


def _stream_handle(stream, fallback):
    if stream is None:
        return fallback()
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream"):  # cupy.cuda.Stream, torch.cuda.Stream
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"cannot use {type(stream).__name__} as a CUDA stream")


def _describe_gpu(x):
    """(ptr, shape, byte strides, numpy dtype, stream fallback, kind) of a CuPy array or torch tensor."""
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy

        dtype = np.dtype(x.dtype)
        return x.data.ptr, x.shape, x.strides, dtype, lambda: cupy.cuda.get_current_stream().ptr, "cupy"
    if mod.startswith("torch"):
        import torch

        if not x.is_cuda:
            raise TypeError("asnumpy expects a CUDA tensor; use tensor.numpy() for CPU tensors")
        try:
            dtype = torch.empty(0, dtype=x.dtype).numpy().dtype
        except TypeError as e:
            raise TypeError(f"{x.dtype} has no NumPy equivalent") from e
        strides = tuple(s * x.element_size() for s in x.stride())
        dev = x.device.index

        def current():
            return torch.cuda.current_stream(dev).cuda_stream

        return x.data_ptr(), tuple(x.shape), strides, dtype, current, "torch"
    raise TypeError(f"asnumpy expects a CuPy array or a torch CUDA tensor, not {type(x).__name__}")


def _copy_to_numpy(x, kind):
    if kind == "cupy":
        import cupy

        return cupy.asnumpy(x)
    return x.detach().cpu().numpy()


def asnumpy(x, stream=None):
    """A NumPy array of GPU array ``x`` (CuPy array or torch CUDA tensor); a NumPy array is
    returned as it is (as ``cupy.asnumpy`` does).

    When ``x`` lives in host-accessible ump memory (managed, registered or system memory, or any
    CUDA managed memory), the result is a view of the same bytes after ``ump_host_access``
    synchronised ``stream`` (default: the array library's current stream); shape, strides and
    dtype are kept and the source stays alive as long as the view. Otherwise it is an ordinary
    copy. ``result.base`` is a :class:`ZeroCopyBuffer` exactly when no copy was made.
    """
    if isinstance(x, np.ndarray):
        return x  # already NumPy: passed through, as cupy.asnumpy does
    ptr, shape, strides, dtype, current_stream, kind = _describe_gpu(x)
    start, nbytes = _span(ptr, shape, strides, dtype.itemsize)
    if nbytes == 0:
        return np.empty(shape, dtype)
    from . import identify

    ident = identify(ptr)
    if not ident.host_accessible or (not ident.ours and ident.kind != "foreign-cuda"):
        return _copy_to_numpy(x, kind)
    handle = _stream_handle(stream, current_stream)
    _lib.check(_lib.lib().ump_host_access(ctypes.c_void_p(start), nbytes, ctypes.c_void_p(handle)), "ump_host_access")
    buf = ZeroCopyBuffer(x, ptr, shape, dtype.str, strides)
    out = np.asarray(buf)
    if dtype.fields is not None or out.dtype != dtype:
        out = out.view(dtype)
    return out


def asarray(a, like="cupy", stream=None, device=None):
    """A CuPy array (``like="cupy"``) or torch CUDA tensor (``like="torch"``) of NumPy array ``a``.

    When ``a``'s memory is reachable by the GPU (ump managed or registered memory; system
    memory with HMM/ATS), is aligned to its itemsize and is writable, the result is a view of
    the same bytes: ``ump_device_access`` prefetches it in ``stream``'s order (no host wait), so
    host writes made before the call are seen by kernels queued after it. Otherwise (or for a
    read-only array, which a GPU view could not protect) it is an ordinary copy.
    """
    if like not in ("cupy", "torch"):
        raise ValueError("like must be 'cupy' or 'torch'")
    a = np.asarray(a)
    dtype = a.dtype
    ptr = a.__array_interface__["data"][0] or 0
    strides = a.strides
    start, nbytes = _span(ptr, a.shape, strides, dtype.itemsize)
    zero_copy = nbytes > 0 and a.flags.writeable and ptr % dtype.alignment == 0
    if zero_copy:
        from . import identify

        ident = identify(ptr)
        zero_copy = ident.device_accessible and (ident.ours or ident.kind in ("foreign-cuda", "system"))
    if like == "cupy":
        import cupy

        dev = cupy.cuda.runtime.getDevice() if device is None else int(device)
        if not zero_copy:
            with cupy.cuda.Device(dev):
                return cupy.array(a, copy=True)
        handle = _stream_handle(stream, lambda: cupy.cuda.get_current_stream().ptr)
        _lib.check(
            _lib.lib().ump_device_access(ctypes.c_void_p(start), nbytes, dev, ctypes.c_void_p(handle)), "ump_device_access"
        )
        # The memory object covers every byte the strides reach (negative strides reach below
        # the data pointer); the array starts at the data pointer inside it.
        mem = cupy.cuda.UnownedMemory(start, nbytes, a, device_id=dev)
        mp = cupy.cuda.MemoryPointer(mem, ptr - start)
        return cupy.ndarray(a.shape, dtype, mp, strides=strides)
    import torch

    dev = torch.cuda.current_device() if device is None else int(device)
    if not zero_copy:
        return torch.as_tensor(a.copy(), device=f"cuda:{dev}")
    handle = _stream_handle(stream, lambda: torch.cuda.current_stream(dev).cuda_stream)
    _lib.check(_lib.lib().ump_device_access(ctypes.c_void_p(start), nbytes, dev, ctypes.c_void_p(handle)), "ump_device_access")
    buf = ZeroCopyBuffer(a, ptr, a.shape, dtype.str, strides, cuda=True)
    with torch.cuda.device(dev):
        return torch.as_tensor(buf, device=f"cuda:{dev}")


def _extent(x):
    if isinstance(x, np.ndarray):
        ai = x.__array_interface__
        return _span(ai["data"][0] or 0, x.shape, x.strides, x.dtype.itemsize)
    mod = type(x).__module__
    if mod.startswith("cupy") or mod.startswith("torch"):
        ptr, shape, strides, dtype, _, _ = _describe_gpu(x)
        return _span(ptr, shape, strides, dtype.itemsize)
    raise TypeError(f"cannot locate the memory of {type(x).__name__}")


def is_zero_copy(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` (NumPy, CuPy or torch, any mix) share memory."""
    s1, n1 = _extent(a)
    s2, n2 = _extent(b)
    return n1 > 0 and n2 > 0 and s1 < s2 + n2 and s2 < s1 + n1
