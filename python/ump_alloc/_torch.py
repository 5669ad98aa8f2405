"""PyTorch integration: two routes, chosen by ``UMP_ALLOC_TORCH_ROUTE`` or
``enable(torch_route=...)``.

``segments`` (the default)
    PyTorch keeps its own CUDA caching allocator, and ump-alloc supplies the segments it caches:
    ``libc10_cuda.so`` calls ``cudaMalloc``/``cudaFree`` for every segment it maps and releases,
    and those two import slots point at ump-alloc (``ump_torch_hook_segments``). Every device,
    thread and stream is covered, and every feature of ``torch.cuda`` works as without
    ump-alloc: memory statistics and snapshots, ``record_stream``, ``empty_cache`` (which also
    gives back what ump-alloc caches), CUDA graphs and ``torch.compile(mode="reduce-overhead")``,
    ``cudnn.benchmark``, a user's ``MemPool``, its out-of-memory retry and
    ``torch.OutOfMemoryError``. It can be switched on at any time: segments PyTorch made before
    stay its own. ``disable()`` switches it off again for new segments.

``swap``
    ump-alloc replaces PyTorch's allocator (``change_current_allocator`` with a
    ``CUDAPluggableAllocator``): every tensor allocation is ump-alloc's, with its stream-ordered
    caching and lower fragmentation, and ``ump_torch_attach`` gives PyTorch's pluggable allocator
    ``record_stream``, ``empty_cache``, the memory fraction and real out-of-memory errors. PyTorch
    accepts it only before its first CUDA tensor and cannot switch back, and on this route the
    calls in :data:`SWAP_UNSUPPORTED` raise.

Why not a ``torch.cuda.MemPool`` fed by ump-alloc with every allocation routed into it
(``torch._C._cuda_beginAllocateToPool``): PyTorch then believes a CUDA-graph capture is under
way for good, and measured with PyTorch 2.11 that leaks every block freed after
``record_stream`` (3 GiB after 300 iterations of an 8 MiB tensor, against 20 MiB natively),
makes ``empty_cache()`` release nothing, skips the out-of-memory retry (an allocation that fits
after freeing the cache raises), and one of the everyday calls aborted the process
(docs/BENCHMARKS.md).
"""

from __future__ import annotations

import ctypes
import os
import warnings

from . import _config, _lib

ROUTES = ("segments", "swap")

#: What PyTorch cannot do on the ``swap`` route (its ``CUDAPluggableAllocator`` lacks it),
#: measured with PyTorch 2.11 (``python_tests/torch_checks.py``'s matrix): each raises
#: ``RuntimeError: CUDAPluggableAllocator does not yet support ...``, but for a CUDA graph
#: capture, which fails with a CUDA error. The ``segments`` route has none of these limits.
SWAP_UNSUPPORTED = (
    "torch.cuda.memory_allocated / max_memory_allocated / memory_reserved / memory_stats / "
    "memory_summary (use ump_alloc.stats() and ump_alloc.memory_summary())",
    "torch.cuda.reset_peak_memory_stats (use ump_alloc.reset_peak())",
    "torch.cuda.memory._record_memory_history and _snapshot",
    "torch.backends.cudnn.benchmark = True (cuDNN's workspace query needs cacheInfo)",
    'torch.compile(mode="reduce-overhead") (CUDA graph trees check their pool)',
    "torch.cuda.graph / CUDAGraph capture of work that allocates (the capture fails)",
    "a torch.cuda.MemPool of your own with torch.cuda.use_mem_pool",
    "sending CUDA tensors to other processes (torch.multiprocessing, CUDA IPC)",
)

_state: dict = {
    "installed": False,
    "route": None,
    "reason": "",
    "attached": False,
    "oom_error": False,
}


class TooLateError(_lib.UmpError):
    """PyTorch already made CUDA tensors with its own allocator (the ``swap`` route only)."""


def route_setting(route: str | None = None) -> str:
    """The route asked for: ``route`` if given, else ``UMP_ALLOC_TORCH_ROUTE`` (default
    ``segments``), read through the library's configuration table (a value it refuses raises
    :class:`UmpError` with the table's message)."""
    if route is None:
        return _config.setting("UMP_ALLOC_TORCH_ROUTE").lower()
    r = str(route).strip().lower()
    if r not in ROUTES:
        raise _lib.UmpError(f"torch_route={route!r}: expected 'segments' or 'swap'", _lib.ERR_CONFIG)
    return r


def install(route: str | None = None, fast_cpu: bool | None = None, unified: bool | None = None) -> None:
    """Give PyTorch ump-alloc memory on ``route`` (see the module's doc) and set up the
    transfers (``fast_cpu``/``unified``; None: ``UMP_ALLOC_TORCH_FAST_CPU``/``UMP_ALLOC_TORCH_UNIFIED``)."""
    import torch

    from . import _torch_transfer

    want = route_setting(route)
    # The transfer switches are read (and a refused value raised) before anything is hooked,
    # so that a bad setting leaves PyTorch as it was.
    switches = {
        "fast_cpu": _config.setting("UMP_ALLOC_TORCH_FAST_CPU") == "1" if fast_cpu is None else bool(fast_cpu),
        "unified": _config.setting("UMP_ALLOC_TORCH_UNIFIED") == "1" if unified is None else bool(unified),
    }
    if _state["installed"]:
        if want == "segments" and _state["route"] == "segments" and not _hooked():
            _hook(torch)  # enable() after disable()
        elif want != _state["route"] and not (want == "segments" and _state["route"] == "native"):
            warnings.warn(
                f"ump-alloc already runs PyTorch on the {_state['route']!r} route; torch_route={want!r} "
                "is ignored (PyTorch's allocator can be chosen once per process)",
                RuntimeWarning,
                stacklevel=4,
            )
        _torch_transfer.install(torch, **switches)
        return
    # No torch.cuda.is_available() here: it starts the CUDA driver (about 0.5 s), which a
    # process that imports PyTorch but never uses a GPU (a spawn DataLoader worker) must not
    # pay. Hooking the segments needs no CUDA; PyTorch without a GPU never calls cudaMalloc.
    if want == "swap" and not torch.cuda.is_available():
        raise _lib.UmpError("PyTorch sees no CUDA device", _lib.ERR_UNSUPPORTED)
    if unified:
        # Views of CUDA tensors on the host need memory the host reads: the device side's
        # (UMP_ALLOC_TORCH_SEGMENTS=auto gives the segments plain device memory otherwise).
        _lib.check(_lib.lib().ump_torch_segment_memory(b"side"), "ump_torch_segment_memory")
    if want == "segments":
        why = _segments_unavailable(torch)
        if why is None:
            why = _hook(torch)
        if why is None:
            _state.update(
                route="segments",
                reason="PyTorch's caching allocator maps its segments from ump-alloc "
                "(libc10_cuda's cudaMalloc/cudaFree)" + _chained(),
            )
        else:
            _fall_back(torch, why)
    else:
        _swap(torch)
        _state.update(route="swap", reason="UMP_ALLOC_TORCH_ROUTE=swap (or enable(torch_route='swap'))")
    _state["installed"] = True
    if _state["route"] == "segments":
        _patch_empty_cache(torch)
    _patch_ipc(torch)
    _torch_transfer.install(torch, **switches)


def uninstall() -> None:
    """``disable()``: PyTorch's new segments come from CUDA again (the ``segments`` route;
    segments it holds from ump-alloc still go back to ump-alloc). The ``swap`` route cannot be
    undone."""
    if _state["route"] == "segments":
        _lib.check(_lib.lib().ump_torch_unhook_segments(), "ump_torch_unhook_segments")


def _hooked() -> bool:
    return bool(_lib.lib().ump_torch_segments_hooked())


def _libdir(torch) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")


def _alloc_conf() -> str:
    return ",".join(os.environ.get(v, "") for v in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))


def _segments_unavailable(torch) -> str | None:
    """Why PyTorch's own allocator would not call cudaMalloc for its segments, or None."""
    backend = getattr(torch.cuda.memory, "get_allocator_backend", lambda: "native")()
    if backend != "native":
        return f"PyTorch's CUDA allocator backend is {backend!r}, not its native caching allocator"
    conf = _alloc_conf().replace(" ", "").lower()
    if "expandable_segments:true" in conf:
        return (
            "PYTORCH_CUDA_ALLOC_CONF has expandable_segments:True, with which PyTorch maps its own "
            "memory through the driver's virtual-memory calls instead of cudaMalloc"
        )
    return None


def _hook(torch) -> str | None:
    """Hook libc10_cuda's cudaMalloc/cudaFree. Returns None, or why it could not."""
    path = os.path.join(_libdir(torch), "libc10_cuda.so")
    rc = _lib.lib().ump_torch_hook_segments(path.encode())
    if rc != _lib.OK:
        return _lib.last_error() or "ump_torch_hook_segments failed"
    return None


def segments_target() -> str | None:
    """The file of the ``cudaMalloc`` the segments route hands what ump-alloc does not serve to
    (the CUDA runtime's, or an interposer's that held the slot before), or None if the route
    was never hooked."""
    t = _lib.lib().ump_torch_segments_target()
    return t.decode() if t else None


def _chained() -> str:
    """Where requests ump-alloc does not serve go, when that is not the CUDA runtime."""
    t = segments_target()
    if t is None or os.path.basename(t).startswith("libcudart"):
        return ""
    return f"; requests it does not serve go to the cudaMalloc of {t} (loaded before PyTorch: chained to, not bypassed)"


def _fall_back(torch, why: str) -> None:
    """The segments route is not available: PyTorch keeps its own CUDA memory, and with it
    everything its settings promise (``expandable_segments``, ``cudaMallocAsync``, a
    ``MemPool``...); NumPy stays on ump-alloc. One warning says which and why. Replacing
    PyTorch's allocator instead (the swap route) would break ten everyday calls, so it is taken
    only when asked for (``UMP_ALLOC_TORCH_ROUTE=swap``)."""
    _state.update(route="native", reason=f"segments route unavailable: {why}")
    warnings.warn(
        f"ump-alloc leaves PyTorch {torch.__version__}'s CUDA memory to PyTorch ({why}): "
        "NumPy's memory (the host side) alone is on ump-alloc, and copies of CUDA tensors to it "
        "(.cpu()) still land there. UMP_ALLOC_TORCH_ROUTE=swap makes ump-alloc replace PyTorch's "
        "allocator instead (memory statistics, snapshots, cudnn.benchmark, MemPool and CUDA IPC "
        "then raise).",
        RuntimeWarning,
        stacklevel=5,
    )


def _swap(torch) -> None:
    """The swap route: ump-alloc as PyTorch's CUDA allocator, with its hooks attached."""
    path = _lib.library_path()
    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "ump_torch_malloc", "ump_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise TooLateError(
            "too late to switch PyTorch to ump-alloc's allocator (the swap route): PyTorch's CUDA "
            "allocator is already in use (a CUDA tensor was made before ump_alloc.enable()). Call "
            "ump_alloc.enable() before the first CUDA tensor, set UMP_ALLOC=1 in the environment, or "
            f"use the segments route (UMP_ALLOC_TORCH_ROUTE=segments). PyTorch said: {e}",
            _lib.ERR_LOCKED,
        ) from e
    _state["allocator"] = alloc
    _attach(torch)


def _attach(torch) -> None:
    """Give PyTorch's pluggable allocator its hooks and a real out-of-memory error."""
    oom = ctypes.c_int(-1)
    lib_path = os.path.join(_libdir(torch), "libtorch_cuda.so")
    rc = _lib.lib().ump_torch_attach(lib_path.encode(), ctypes.byref(oom))
    if rc != _lib.OK:
        warnings.warn(
            "ump-alloc could not attach to PyTorch's pluggable allocator "
            f"({_lib.last_error()}): tensor.record_stream() is ignored (a block used on a side "
            "stream may be reused while that stream still reads it: synchronise the side stream "
            "before freeing), torch.cuda.empty_cache() and set_per_process_memory_fraction() do "
            "nothing, and an allocation failure makes a tensor at address 0. Use the segments route "
            "(UMP_ALLOC_TORCH_ROUTE=segments), or ump_alloc.trim() and UMP_ALLOC_LIMIT, or report "
            "your PyTorch version.",
            RuntimeWarning,
            stacklevel=5,
        )
        return
    _state["attached"] = True
    _state["oom_error"] = oom.value == 1


_orig: dict = {}


def _patch_empty_cache(torch) -> None:
    """``torch.cuda.empty_cache()`` releases PyTorch's cached segments (to ump-alloc, on the
    segments route); then ump-alloc gives back what it caches on the device side, so the memory
    goes back to the driver as it does without ump-alloc."""
    if "empty_cache" in _orig:
        return
    mem = torch.cuda.memory
    original = mem.empty_cache

    def empty_cache() -> None:
        original()
        _lib.lib().ump_torch_empty_cache()

    empty_cache.__doc__ = original.__doc__
    empty_cache.__wrapped__ = original
    _orig["empty_cache"] = original
    mem.empty_cache = empty_cache
    if getattr(torch.cuda, "empty_cache", None) is original:
        torch.cuda.empty_cache = empty_cache


def _patch_ipc(torch) -> None:
    """CUDA IPC (``torch.multiprocessing``, ``share_memory_``) of a tensor on memory CUDA IPC
    cannot export (managed memory, the virtual-memory pool) fails with a message naming the
    setting that makes it work, instead of ``CUDA error: invalid argument``."""
    if "share_cuda" in _orig:
        return
    S = torch.UntypedStorage
    original = S._share_cuda_

    def _share_cuda_(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as e:
            hint = ipc_hint(self.data_ptr())
            if hint is None:
                raise
            raise RuntimeError(f"{hint} (PyTorch said: {str(e).splitlines()[0]})") from e

    _orig["share_cuda"] = original
    S._share_cuda_ = _share_cuda_


def ipc_hint(ptr: int) -> str | None:
    """Why CUDA IPC cannot export the ump-alloc memory at ``ptr``, with the fix; None when it is
    not ump-alloc memory or can be exported."""
    from ._identity import identify

    ident = identify(ptr)
    if not ident.ours or ident.device < 0:
        return None
    if ident.kind == "device" and not _vmm_device_side():
        return None
    what = "virtual-memory pool" if ident.kind == "device" else f"{ident.kind} memory"
    return (
        f"CUDA IPC cannot share this tensor: it lives in ump-alloc's {what}, which CUDA IPC "
        "cannot export. Start the sending process with UMP_ALLOC_TORCH_SEGMENTS=device (PyTorch's "
        "segments as plain cudaMalloc-style device memory, which it shares: the default unless "
        "UMP_ALLOC_DEVICE_SIDE, UMP_ALLOC_MODE or UMP_ALLOC_TORCH_UNIFIED is set), or with "
        "UMP_ALLOC_DEVICE_VMM=0 where the device side is plain device memory"
    )


def _vmm_device_side() -> bool:
    """Whether plain device memory of the device side is a virtual-memory pool
    (``UMP_ALLOC_DEVICE_VMM``); for an error message, so a value the table refuses reads as
    the default."""
    try:
        return _config.setting("UMP_ALLOC_DEVICE_VMM") != "0"
    except _lib.UmpError:
        return True


def active() -> bool:
    return _state["installed"]


def route() -> str | None:
    """The route in force (``segments``, ``swap``, ``native`` after a fall-back), or None
    before PyTorch was switched over."""
    return _state["route"] if _state["installed"] else None


def reason() -> str:
    """Why the route in force was taken."""
    return _state["reason"]


def attached() -> bool:
    """Whether PyTorch's allocator has ump-alloc's hooks (the swap route: record_stream,
    empty_cache, the memory fraction, out-of-memory errors)."""
    return _state["attached"]
