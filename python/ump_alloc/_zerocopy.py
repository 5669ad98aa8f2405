"""Explicit transfers between NumPy and CuPy / PyTorch that never lose: ``asnumpy`` and
``asarray`` hand over a *view* of the same memory (made safe by a stream synchronisation,
``ump_host_access``, or a stream-ordered prefetch, ``ump_device_access``) or a stream-ordered
*DMA copy* into the other side's memory, whichever the transfer plan (``_transfer``) says is
faster for what the reader will do; ``copy=True`` / ``copy=False`` force one (NumPy 2's
``asarray`` convention).

A view's ``.base`` is a :class:`ZeroCopyBuffer` that keeps the source alive. A copy owns its
data (``.base is None`` for NumPy results). ``is_zero_copy(a, b)`` tells whether two arrays
share memory.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from . import _lib, _transfer


class ZeroCopyBuffer:
    """Exposes another library's memory through the array interfaces, keeping it alive."""

    def __init__(
        self,
        owner: object,
        ptr: int,
        shape: Sequence[int],
        typestr: str,
        strides: Sequence[int] | None,
        readonly: bool = False,
        cuda: bool = False,
        stream: object = None,
    ) -> None:
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


class _Gpu(NamedTuple):
    """What asnumpy needs to know of a CuPy array or torch CUDA tensor."""

    ptr: int
    shape: tuple
    strides: tuple  # in bytes
    dtype: np.dtype
    current_stream: object  # () -> handle of the library's current stream on the array's device
    kind: str  # "cupy" or "torch"
    device: int


def _describe_gpu(x) -> _Gpu:
    mod = type(x).__module__
    if mod.startswith("cupy"):
        import cupy

        dev = x.device.id
        return _Gpu(x.data.ptr, x.shape, x.strides, np.dtype(x.dtype), lambda: _cupy_current(cupy, dev), "cupy", dev)
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

        return _Gpu(x.data_ptr(), tuple(x.shape), strides, dtype, current, "torch", dev)
    raise TypeError(f"asnumpy expects a CuPy array or a torch CUDA tensor, not {type(x).__name__}")


def _host_empty(shape, dtype, order="C"):
    """An empty NumPy array for a copy from the GPU: on ump-alloc's host side (pinned memory
    where the mode has it, so the DMA runs at link speed) once ump-alloc is initialised, else
    from NumPy's current allocator."""
    from ._runtime import mode

    if mode() in ("unset", "host"):
        return np.empty(shape, dtype, order=order)
    from . import _numpy

    with _numpy.allocating():  # either NumPy route: numpy_allocator need not be installed
        return np.empty(shape, dtype, order=order)


def _cupy_current(cupy, dev):
    """The handle of CuPy's current stream on device ``dev``."""
    with cupy.cuda.Device(dev):
        return cupy.cuda.get_current_stream().ptr


def _cupy_stream(cupy, handle):
    cur = cupy.cuda.get_current_stream()
    return cur if cur.ptr == handle else cupy.cuda.ExternalStream(handle)


def _torch_stream(torch, handle, dev):
    cur = torch.cuda.current_stream(dev)
    return cur if cur.cuda_stream == handle else torch.cuda.ExternalStream(handle, device=f"cuda:{dev}")


def _copy_to_host(x, g: _Gpu, handle: int):
    """A DMA copy of ``x`` into a new NumPy array, queued on stream ``handle`` after its work;
    returns when the copy is done."""
    if g.kind == "cupy":
        import cupy

        order = "F" if x.flags.f_contiguous and not x.flags.c_contiguous else "C"
        out = _host_empty(g.shape, g.dtype, order)
        with cupy.cuda.Device(g.device):
            x.get(stream=_cupy_stream(cupy, handle), out=out)  # synchronises the stream
        return out
    import torch

    t = x.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    out = _host_empty(g.shape, g.dtype)
    s = _torch_stream(torch, handle, g.device)
    with torch.cuda.device(g.device), torch.cuda.stream(s):
        torch.from_numpy(out).copy_(t, non_blocking=True)
    s.synchronize()
    return out


def _resolve(plan: _transfer.TransferPlan, copy, why_not_view: str | None = None) -> bool:
    """Whether to make a view: the plan's choice for ``copy=None``, never for ``copy=True``, and
    always for ``copy=False`` (ValueError where a view is impossible)."""
    if copy is None:
        return why_not_view is None and plan.path == "view"
    if copy:
        return False
    if why_not_view is None and not plan.view_possible:
        why_not_view = plan.reason
    if why_not_view is not None:
        raise ValueError(f"copy=False, but a view is not possible here: {why_not_view}; pass copy=None to allow a copy")
    return True


def asnumpy(x: Any, stream: Any = None, *, copy: bool | None = None, touch: float | None = None) -> np.ndarray:
    """A NumPy array of GPU array ``x`` (CuPy array or torch CUDA tensor), made the faster way
    for a host that reads ``touch`` of it; a NumPy array is returned as it is (as
    ``cupy.asnumpy`` does; ``copy=True`` copies it).

    - ``copy=None`` (default): the transfer plan decides (:func:`transfer_plan`). A **view** of
      the same bytes where the host reads them where they are (pinned, registered or system
      memory; managed pages on the host), where the host touches little of the array, and on
      coherent (HMM/ATS) machines; a **DMA copy into pinned memory** where the host will read
      most of GPU-resident managed memory (52 GB/s against 19 GB/s of migration on the lent
      H100s) and where the host cannot reach the memory at all.
    - ``copy=True``: always a copy. ``copy=False``: always a view; ``ValueError`` where the host
      cannot reach the memory.
    - ``touch``: the fraction of the array the host will read (None: all of it; 0.01: a
      hundredth). A view for a sparse reader migrates nothing: the pages it touches fault over.

    Either way the result is ordered after the work queued on ``stream`` (default: the array
    library's current stream on ``x``'s device): a copy is queued there and waited for, a view
    synchronises it (``ump_host_access``). A view keeps shape, strides and dtype; its ``.base``
    is a :class:`ZeroCopyBuffer` that keeps ``x`` alive, and writes through it show in ``x``.
    A copy owns its data (``.base is None``), on ump-alloc's host side once ump-alloc is on.
    :func:`is_zero_copy` tells which one was made.
    """
    _transfer.check_copy(copy)
    t = _transfer.check_touch(touch)
    if isinstance(x, np.ndarray):
        return np.array(x, copy=True) if copy else x  # already NumPy, as cupy.asnumpy passes it
    g = _describe_gpu(x)
    start, nbytes = _span(g.ptr, g.shape, g.strides, g.dtype.itemsize)
    if nbytes == 0:
        return np.empty(g.shape, g.dtype)
    plan = _transfer.plan_range(start, nbytes, "host", g.device, t)
    handle = _stream_handle(stream, g.current_stream)
    if not _resolve(plan, copy):
        return _copy_to_host(x, g, handle)
    _lib.check(
        _lib.lib().ump_host_access_ex(ctypes.c_void_p(start), nbytes, ctypes.c_void_p(handle), t), "ump_host_access_ex"
    )
    buf = ZeroCopyBuffer(x, g.ptr, g.shape, g.dtype.str, g.strides)
    out = np.asarray(buf)
    if g.dtype.fields is not None or out.dtype != g.dtype:
        out = out.view(g.dtype)
    return out


def _copy_to_device(a, like, dev, handle):
    """A DMA copy of NumPy array ``a`` to device ``dev``, queued on stream ``handle`` after its
    work; returns when the copy is done (later host writes to ``a`` do not reach it)."""
    if like == "cupy":
        import cupy

        s = _cupy_stream(cupy, handle)
        with cupy.cuda.Device(dev), s:
            g = cupy.array(a, copy=True)
        s.synchronize()
        return g
    import torch

    if not (a.flags.writeable and all(st >= 0 for st in a.strides) and a.dtype.isnative):
        a = np.array(a, dtype=a.dtype.newbyteorder("="), copy=True)  # what torch.from_numpy takes
    src = a
    s = _torch_stream(torch, handle, dev)
    with torch.cuda.device(dev), torch.cuda.stream(s):
        g = torch.from_numpy(src).to(f"cuda:{dev}", copy=True)  # non_blocking=False: waits
    return g


def asarray(
    a: Any,
    like: str = "cupy",
    stream: Any = None,
    device: int | None = None,
    *,
    copy: bool | None = None,
    touch: float | None = None,
) -> Any:
    """A CuPy array (``like="cupy"``) or torch CUDA tensor (``like="torch"``) of NumPy array
    ``a``, made the faster way for kernels that read ``touch`` of it.

    - ``copy=None`` (default): the transfer plan decides (:func:`transfer_plan`). A **view** of
      the same bytes where kernels reach them at no extra cost (managed memory, prefetched to
      the device in stream order; memory already on the device), where kernels touch little of
      the array, and on coherent (HMM/ATS) machines; a **DMA copy into device memory** where
      kernels will read most of pinned host memory (one copy at 51 GB/s, then device-memory
      speed, against PCIe at every pass on the lent H100s) and where the GPU cannot reach the
      memory at all (pageable memory without HMM/ATS).
    - ``copy=True``: always a copy. ``copy=False``: always a view; ``ValueError`` where the GPU
      cannot reach the memory, or for a read-only or misaligned array (a GPU view could not
      keep it read-only or address it).
    - ``touch``: the fraction of the array kernels will read (None: all of it once; 0.01: a
      hundredth; 3: three passes).

    Either way the result is ordered after the work queued on ``stream`` (default: the
    library's current stream on ``device``): a copy is queued there and waited for (host writes
    to ``a`` after the call do not reach it), a view is prefetched there
    (``ump_device_access``), so host writes made before the call are seen by kernels queued
    after it. A view's writes show in ``a`` and ``a`` stays alive as long as the view.
    """
    if like not in ("cupy", "torch"):
        raise ValueError("like must be 'cupy' or 'torch'")
    _transfer.check_copy(copy)
    t = _transfer.check_touch(touch)
    a = np.asarray(a)
    dtype = a.dtype
    ptr = a.__array_interface__["data"][0] or 0
    strides = a.strides
    start, nbytes = _span(ptr, a.shape, strides, dtype.itemsize)
    if like == "cupy":
        import cupy

        dev = cupy.cuda.runtime.getDevice() if device is None else int(device)
        current = lambda: _cupy_current(cupy, dev)  # noqa: E731
    else:
        import torch

        dev = torch.cuda.current_device() if device is None else int(device)
        current = lambda: torch.cuda.current_stream(dev).cuda_stream  # noqa: E731
    handle = _stream_handle(stream, current)
    if nbytes == 0:
        return _copy_to_device(a, like, dev, handle)  # nothing to share: an empty array
    why_not = None
    if not a.flags.writeable:
        why_not = "the array is read-only, which a GPU view could not keep"
    elif ptr % dtype.alignment:
        why_not = f"the array's address is not aligned to its itemsize ({dtype.alignment})"
    plan = _transfer.plan_range(start, nbytes, "device", dev, t)
    if not _resolve(plan, copy, why_not):
        return _copy_to_device(a, like, dev, handle)
    _lib.check(
        _lib.lib().ump_device_access_ex(ctypes.c_void_p(start), nbytes, dev, ctypes.c_void_p(handle), t),
        "ump_device_access_ex",
    )
    if like == "cupy":
        # The memory object covers every byte the strides reach (negative strides reach below
        # the data pointer); the array starts at the data pointer inside it.
        mem = cupy.cuda.UnownedMemory(start, nbytes, a, device_id=dev)
        mp = cupy.cuda.MemoryPointer(mem, ptr - start)
        return cupy.ndarray(a.shape, dtype, mp, strides=strides)
    buf = ZeroCopyBuffer(a, ptr, a.shape, dtype.str, strides, cuda=True)
    with torch.cuda.device(dev):
        return torch.as_tensor(buf, device=f"cuda:{dev}")


def transfer_plan(
    x: Any, to: str | None = None, *, touch: float | None = None, device: int | None = None
) -> _transfer.TransferPlan:
    """What :func:`asnumpy` (``to="host"``) or :func:`asarray` (``to="device"``) would do with
    ``x`` by default, and why: a :class:`TransferPlan`. ``to`` defaults to ``"host"`` for a CuPy
    array or torch tensor and ``"device"`` for a NumPy array; ``touch`` as in those functions;
    ``device``: the GPU that reads it (default 0) or that it comes from (default: its own)."""
    if isinstance(x, np.ndarray):
        ai = x.__array_interface__
        start, nbytes = _span(ai["data"][0] or 0, x.shape, x.strides, x.dtype.itemsize)
        dev = -1 if device is None else int(device)
        to = "device" if to is None else to
        if to == "device" and device is None:
            dev = 0
    else:
        g = _describe_gpu(x)
        start, nbytes = _span(g.ptr, g.shape, g.strides, g.dtype.itemsize)
        dev = g.device if device is None else int(device)
        to = "host" if to is None else to
    return _transfer.plan_range(start, nbytes, to, dev, touch)


def _extent(x):
    if isinstance(x, np.ndarray):
        ai = x.__array_interface__
        return _span(ai["data"][0] or 0, x.shape, x.strides, x.dtype.itemsize)
    mod = type(x).__module__
    if mod.startswith("cupy") or mod.startswith("torch"):
        g = _describe_gpu(x)
        return _span(g.ptr, g.shape, g.strides, g.dtype.itemsize)
    raise TypeError(f"cannot locate the memory of {type(x).__name__}")


def is_zero_copy(a: Any, b: Any) -> bool:
    """Whether arrays ``a`` and ``b`` (NumPy, CuPy or torch, any mix) share memory."""
    s1, n1 = _extent(a)
    s2, n2 = _extent(b)
    return n1 > 0 and n2 > 0 and s1 < s2 + n2 and s2 < s1 + n1
