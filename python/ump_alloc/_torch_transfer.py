"""PyTorch transfers under ump-alloc: fast copies in unchanged programs, and RFC-0023 as an opt-in.

**Fast ``.cpu()``** (``UMP_ALLOC_TORCH_FAST_CPU=1``, the default): ``Tensor.cpu()``,
``Tensor.to(<cpu>)`` and ``Tensor.numpy(force=True)`` of a CUDA tensor copy into a CPU tensor
over ump-alloc's host side (NumPy's memory: pinned and mapped on GPUs without HMM/ATS), so the
copy runs at PCIe DMA speed instead of through pageable memory (measured on the H200: 52 against
3 GB/s). The result is a new tensor, as before (``copy_`` into it is what PyTorch's own
``_to_copy`` does). The original path is kept wherever the result could differ or the win is
nil: tensors below 1 MiB, ``non_blocking=True`` (PyTorch pins that destination itself and tracks
it with events), autograd (a source that requires grad with grad mode on), overlapping or
gapped views (PyTorch's ``preserve_format`` makes those contiguous), conjugated or negated
views, tensor subclasses, an explicit ``memory_format``, and while tracing or compiling. Dense
sources of any layout (contiguous, channels-last, transposed) keep their exact strides, as
PyTorch's ``empty_strided`` does. The result's storage is NumPy's buffer, which PyTorch cannot
resize (``resize_`` to a larger size raises). ``torch.from_numpy(a).cuda()`` needs nothing:
``a`` is already pinned.

**Unified ``.to()``** (``UMP_ALLOC_TORCH_UNIFIED=1``, off by default; pytorch/rfcs#36): ``.to()``
that only changes the device returns a tensor on *the same memory* when both processors reach it:
a CPU tensor on ump-alloc's pinned host side becomes a CUDA tensor at the same address, and a
CUDA tensor on ump-alloc's managed (or pinned) device side becomes a CPU tensor after the
current stream is synchronised. ``copy=True``, a dtype change, autograd and memory PyTorch owns
still copy. Differences from a copy: writes through either tensor show in the other; the memory
lives while either tensor does; GPU kernels on pinned host memory read it over PCIe (about
85 GB/s, against about 1.7 TB/s from device memory), and the host's first reads of managed
memory fault pages over (about 7 GB/s), so it wins for data touched once and loses for data
reused many times (docs/BENCHMARKS.md).

**``non_blocking=True`` copies to the GPU** (always on): a copy from a CPU tensor or Parameter
whose storage starts at a block of ump-alloc's keeps that storage until the copy ran, where on
pinned memory NumPy would otherwise reuse it first (``_torch_async``).
"""

from __future__ import annotations

from . import _torch_async as _async

# Below this, the copy is latency-bound and PyTorch's own path is as fast.
MIN_BYTES = 1 << 20

_orig: dict = {}
_state = {"fast_cpu": False, "unified": False}

def install(torch, fast_cpu: bool, unified: bool) -> None:
    """Patch ``torch.Tensor.cpu``/``to``/``numpy`` (once) for the switches given (``_torch.install``
    reads ``UMP_ALLOC_TORCH_FAST_CPU``/``UMP_ALLOC_TORCH_UNIFIED`` where its caller left them)."""
    _state["fast_cpu"] = bool(fast_cpu)
    _state["unified"] = bool(unified)
    if _orig:
        return
    T = torch.Tensor
    _orig.update(cpu=T.cpu, to=T.to, numpy=T.numpy, cuda=T.cuda, torch=torch)
    T.cpu = _cpu
    T.to = _to
    T.numpy = _numpy
    T.cuda = _cuda


def uninstall() -> None:
    """Restore PyTorch's methods (waiting for the non_blocking copies whose sources are held)."""
    if _orig:
        _async.release_all(_orig["torch"])
        T = _orig["torch"].Tensor
        T.cpu, T.to, T.numpy, T.cuda = _orig["cpu"], _orig["to"], _orig["numpy"], _orig["cuda"]
        _orig.clear()


def active() -> dict:
    """Which behaviours are on."""
    return {"fast_cpu": bool(_orig) and _state["fast_cpu"], "unified": bool(_orig) and _state["unified"]}


# ---- the checks ------------------------------------------------------------------------------


def _plain_cuda(t, torch) -> bool:
    """A dense, contiguous, plain CUDA tensor whose copy we may produce ourselves."""
    return (
        type(t) is torch.Tensor
        and t.is_cuda
        and _dense(t.shape, t.stride())
        and not t.is_conj()
        and not t.is_neg()
        and not (t.requires_grad and torch.is_grad_enabled())
        and not _tracing(torch)
    )


def _tracing(torch) -> bool:
    try:
        if torch.jit.is_tracing() or torch.jit.is_scripting():
            return True
        compiler = getattr(torch, "compiler", None)
        return bool(compiler is not None and compiler.is_compiling())
    except Exception:  # noqa: BLE001 - be conservative
        return True


def _dense(shape, stride) -> bool:
    """Whether a layout covers exactly ``numel`` elements with no overlap and no gap (PyTorch's
    ``is_non_overlapping_and_dense``): then ``preserve_format`` keeps these very strides."""
    dims = sorted((st, sz) for sz, st in zip(shape, stride) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def _host_empty(shape, stride, dtype, torch):
    """An empty CPU tensor with ``shape`` and (dense) ``stride`` over ump-alloc's host side: a
    NumPy uint8 buffer's storage, set as the tensor's storage (not a view of another tensor)."""
    import numpy as np

    from . import _numpy

    nbytes = _numel(shape) * (dtype.itemsize if hasattr(dtype, "itemsize") else torch.empty((), dtype=dtype).element_size())
    with _numpy.allocating():
        buf = np.empty(nbytes, np.uint8)
    storage = torch.from_numpy(buf).untyped_storage()  # keeps `buf` (and its memory) alive
    return torch.empty(0, dtype=dtype).set_(storage, 0, tuple(shape), tuple(stride))


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _fast_copy_to_cpu(self, dtype, torch):
    if not (_state["fast_cpu"] and _plain_cuda(self, torch)):
        return None
    dtype = dtype or self.dtype
    if self.nbytes < MIN_BYTES:
        return None
    dst = _host_empty(self.shape, self.stride(), dtype, torch)
    dst.copy_(self)  # synchronous: the data is there when this returns, as with .cpu()
    return dst


# ---- unified (RFC-0023) ----------------------------------------------------------------------


def _view_of(t, typestr, cuda: bool):
    """The array interface (``__cuda_array_interface__`` when ``cuda``) of tensor ``t``'s
    memory, keeping ``t`` alive."""
    from ._zerocopy import ZeroCopyBuffer

    strides = tuple(s * t.element_size() for s in t.stride())
    return ZeroCopyBuffer(t, t.data_ptr(), tuple(t.shape), typestr, strides, cuda=cuda)


def _typestr(t):
    import numpy as np

    try:
        return np.dtype(str(t.dtype).replace("torch.", "")).str
    except TypeError:
        return None  # bfloat16 and friends have no array-interface type


def _identity(t):
    from ._identity import identify

    try:
        return identify(t.data_ptr())
    except Exception:  # noqa: BLE001
        return None


def _unified_to(self, device, dtype, copy, torch):
    """The same memory on `device`, or None (copy as usual)."""
    if not _state["unified"] or copy or type(self) is not torch.Tensor or self.numel() == 0:
        return None
    if (dtype is not None and dtype != self.dtype) or (self.requires_grad and torch.is_grad_enabled()):
        return None
    if _tracing(torch) or self.is_conj() or self.is_neg():
        return None
    typestr = _typestr(self)
    if device.type == "cuda" and not self.is_cuda:
        from ._identity import pin_for_gpu

        pin_for_gpu(-1 if device.index is None else device.index)  # before the check below
    ident = _identity(self)
    if typestr is None or ident is None or not ident.ours:
        return None
    if device.type == "cuda" and not self.is_cuda and ident.device_accessible:
        out = torch.as_tensor(_view_of(self, typestr, cuda=True), device=device)
        return out if out.data_ptr() == self.data_ptr() else None
    if device.type == "cpu" and self.is_cuda and ident.host_accessible:
        import numpy as np

        torch.cuda.current_stream(self.device).synchronize()
        return torch.from_numpy(np.asarray(_view_of(self, typestr, cuda=False)))
    return None


# ---- the patched methods ---------------------------------------------------------------------


def _cpu(self, memory_format=None):
    # The common cases leave at once: subclasses (FakeTensor under torch.compile has symbolic
    # sizes: no numel), CPU tensors, and small ones when unified is off.
    if (
        type(self) is not _orig["torch"].Tensor
        or not self.is_cuda
        or (self.nbytes < MIN_BYTES and not _state["unified"])
    ):
        return _orig["cpu"](self) if memory_format is None else _orig["cpu"](self, memory_format=memory_format)
    torch = _orig["torch"]
    if memory_format is None or memory_format is torch.preserve_format:
        r = _unified_to(self, torch.device("cpu"), None, False, torch) if self.is_cuda else None
        if r is None and self.is_cuda:
            r = _fast_copy_to_cpu(self, None, torch)
        if r is not None:
            return r
        return _orig["cpu"](self) if memory_format is None else _orig["cpu"](self, memory_format=memory_format)
    return _orig["cpu"](self, memory_format=memory_format)


_TO_KEYS = {"device", "dtype", "non_blocking", "copy", "memory_format"}


def _to_cpu_maybe(args, kwargs, torch) -> bool:
    """Whether this .to() call may target the CPU (cheap; no parsing)."""
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, str):
        return target.startswith("cpu")
    if isinstance(target, torch.device):
        return target.type == "cpu"
    return isinstance(target, torch.Tensor) and not target.is_cuda


def _guard_call(fn, self, args, kwargs, torch):
    """The patched ``.to``/``.cuda`` (``fn``) of a CPU tensor or Parameter (as ``Module.to``
    moves them) asking for ``non_blocking``: the call, with its source kept until the copy ran
    (``_torch_async``). None for every other call, which the caller makes its own way (one
    that is not ``non_blocking`` lets go of finished copies now and then)."""
    cls = type(self)
    if (cls is not torch.Tensor and not issubclass(cls, torch.nn.Parameter)) or self.is_cuda:
        return None
    asked = _async.non_blocking(args, kwargs)
    if not (asked or _async._held[0]) or _tracing(torch):
        return None
    if asked:
        return _async.guarded(fn, self, args, kwargs, torch)
    _async.drop_now_and_then(torch)
    return None


def _to(self, *args, **kwargs):
    torch = _orig["torch"]
    r = _guard_call(_orig["to"], self, args, kwargs, torch)
    if r is not None:
        return r
    if type(self) is not torch.Tensor:
        # Subclasses (FakeTensor under torch.compile, with symbolic sizes) keep PyTorch's path.
        return _orig["to"](self, *args, **kwargs)
    if _state["unified"]:
        if not set(kwargs) <= _TO_KEYS:
            return _orig["to"](self, *args, **kwargs)
    elif not self.is_cuda or self.nbytes < MIN_BYTES or not _to_cpu_maybe(args, kwargs, torch):
        # .to(dtype), .to("cuda"), small tensors: PyTorch's own path with one check.
        return _orig["to"](self, *args, **kwargs)
    try:
        # copy is the argument after non_blocking: 4th of to(device, dtype, non_blocking, copy),
        # 3rd of to(dtype, non_blocking, copy) and to(other, non_blocking, copy).
        at = 2 if args and isinstance(args[0], (torch.dtype, torch.Tensor)) else 3
        copy = bool(args[at]) if len(args) > at else bool(kwargs.get("copy", False))
        if len(args) > at + 1 or (len(args) > at and "copy" in kwargs):
            return _orig["to"](self, *args, **kwargs)  # PyTorch's own error
        kw = {k: v for k, v in kwargs.items() if k != "copy"}
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args[:at], **kw)
    except Exception:  # noqa: BLE001 - PyTorch's own error message is the right one
        return _orig["to"](self, *args, **kwargs)
    if device is None or non_blocking or memory_format not in (None, torch.preserve_format):
        return _orig["to"](self, *args, **kwargs)
    r = _unified_to(self, device, dtype, copy, torch)
    if r is None and device.type == "cpu" and self.is_cuda:
        r = _fast_copy_to_cpu(self, dtype, torch)
    return r if r is not None else _orig["to"](self, *args, **kwargs)


def _cuda(self, *args, **kwargs):
    r = _guard_call(_orig["cuda"], self, args, kwargs, _orig["torch"])
    return r if r is not None else _orig["cuda"](self, *args, **kwargs)


def _numpy(self, *, force=False):
    torch = _orig["torch"]
    if force and type(self) is torch.Tensor and self.is_cuda and (self.nbytes >= MIN_BYTES or _state["unified"]):
        t = self.detach()
        if not (t.is_conj() or t.is_neg()):
            r = _unified_to(t, torch.device("cpu"), None, False, torch) or _fast_copy_to_cpu(t, None, torch)
            if r is not None:
                return _orig["numpy"](r)
    return _orig["numpy"](self, force=force)
