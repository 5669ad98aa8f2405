"""The allocator's counters (:func:`stats`, ``ump_stats``; :func:`reset_peak`) and scopes
(:func:`scope`, ``ump_scope_begin_ex`` / ``ump_scope_end_ex``)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses

from . import _lib

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up
if TYPE_CHECKING:
    from typing import Literal


def stats() -> dict:
    """The allocator's counters, as ``ump_stats`` reports them.

    Each usage entry has ``in_use``/``in_use_peak`` (bytes handed out, as requested),
    ``mapped``/``mapped_peak`` (bytes taken from the OS or the driver), ``cached`` (free bytes
    ready for reuse), and ``allocs``, ``frees``, ``hits``, ``misses``. ``host`` is the NumPy
    side (``host_fallback``: what plain host memory served it when its own kind was not
    available, e.g. at the pinned cap or in a fork() child; ``pinned``: pinned bytes and cap); ``devices[i]`` is everything CuPy and PyTorch hold on device ``i`` (all streams):
    ``stats()["devices"][0]["in_use_peak"]`` is PyTorch's ``max_memory_allocated``, which its
    pluggable-allocator path cannot report. Peaks of ``host`` and of each device are exact;
    ``total`` and per-kind peaks that add several of them are upper bounds.

    ``host`` and each ``devices[i]`` also have ``reserved`` (bytes of address space their pools
    hold: a virtual-memory device pool reserves address space once and maps physical memory
    into it as blocks land, so ``mapped`` is the memory it holds and ``reserved`` can be far
    larger; elsewhere the two are equal but for rounding), ``largest_free`` (the largest block
    served without mapping more) and ``fragmentation`` (``1 - largest_free / cached``: 0 when
    the cache is one free block, near 1 when it is scattered in pieces too small to use).
    Each device also has ``discarded``: bytes of managed memory discarded so far (freed blocks
    the host had read, so their dead pages never migrate again; reused ones
    discarded-and-prefetched to the device; ``UMP_ALLOC_MANAGED_DISCARD``). ``realloc`` counts
    NumPy's reallocations (``ndarray.resize``, ``np.fromiter``...): done
    ``in_place`` with no copy (the block stayed, grew over free memory or with its chunk, or
    moved with its pages), or ``copied``, with the ``copied_bytes``. ``fork_held``: pinned
    NumPy memory this process freed but holds back, not reused, because a ``fork()`` child
    made while it was live may still read it (``UMP_ALLOC_PINNED_FORK=share``, the default):
    ``bytes`` and ``blocks``; it goes back once no such child lives.
    """
    s = _lib.Stats()
    s.size = ctypes.sizeof(_lib.Stats)
    _lib.check(_lib.lib().ump_stats(ctypes.byref(s)), "ump_stats")
    kinds = {
        _lib.KIND_NAMES[k]: s.kinds[k].as_dict()
        for k in range(len(s.kinds))
        if s.kinds[k].mapped_peak or s.kinds[k].allocs
    }
    devices = {
        i: {
            **_with_layout(s.devices[i].as_dict(), s.device_reserved[i], s.device_largest_free[i]),
            "discarded": int(s.device_discarded[i]),
        }
        for i in range(min(s.device_count, _lib.MAX_DEVICES))
        if s.devices[i].mapped_peak or s.devices[i].allocs
    }
    return {
        "version": int(s.version),
        "mode": _lib.MODE_NAMES.get(s.mode, "unset"),
        "total": s.total.as_dict(),
        "host": _with_layout(s.host.as_dict(), s.host_reserved, s.host_largest_free),
        "realloc": {
            "in_place": int(s.host_reallocs_in_place),
            "copied": int(s.host_reallocs_copied),
            "copied_bytes": int(s.host_realloc_copied_bytes),
        },
        "host_kind": _lib.KIND_NAMES.get(s.host_kind, "unknown"),
        "device_kind": _lib.KIND_NAMES.get(s.device_kind, "unknown"),
        "kinds": kinds,
        "devices": devices,
        "streams": int(s.streams),
        "stream_waits": int(s.stream_waits),
        "stream_syncs": int(s.stream_syncs),
        "scopes_open": int(s.scopes_open),
        "host_fallback": {"allocs": int(s.host_fallback_allocs), "mapped": int(s.host_fallback_mapped)},
        "pinned": {"bytes": int(s.pinned), "cap": int(s.pinned_cap)},
        "fork_held": {"bytes": int(s.host_fork_held), "blocks": int(s.host_fork_held_blocks)},
        "errors": {
            "total": int(s.errors),
            "oom": int(s.errors_oom),
            "invalid_free": int(s.errors_invalid_free),
            "double_free": int(s.errors_double_free),
            "bad_size": int(s.errors_bad_size),
            "other": int(s.errors_other),
        },
    }


def _with_layout(usage: dict, reserved: int, largest_free: int) -> dict:
    """``usage`` with ``reserved``, ``largest_free`` and ``fragmentation`` added."""
    usage["reserved"] = int(reserved)
    usage["largest_free"] = int(largest_free)
    usage["fragmentation"] = 1.0 - min(1.0, largest_free / usage["cached"]) if usage["cached"] else 0.0
    return usage


def reset_peak() -> None:
    """Reset every peak in :func:`stats` to the current value (like
    ``torch.cuda.reset_peak_memory_stats``)."""
    _lib.check(_lib.lib().ump_reset_peak(), "ump_reset_peak")


@dataclasses.dataclass
class ScopeReport:
    """What a :func:`scope` saw. ``live_blocks``/``live_bytes``: blocks allocated in the scope
    and still referenced at its end (they escaped the scope and stay valid)."""

    allocs: int = 0
    alloc_bytes: int = 0
    frees: int = 0
    peak_bytes: int = 0
    live_blocks: int = 0
    live_bytes: int = 0


class scope(contextlib.ContextDecorator):
    """``with ump_alloc.scope() as s:`` groups the blocks this thread allocates (NumPy, CuPy,
    PyTorch) and reports on them at the end (``s.report``, a :class:`ScopeReport`).

    A block goes back to the cache as soon as its array dies. Python frees arrays through
    their reference counts, so an array still referenced when the scope ends is never freed
    under its owner (that would be a use-after-free); it is reported in
    ``report.live_blocks`` instead. ``collect=True`` first runs the garbage collector, so arrays
    kept only by reference cycles created in the scope go back too. The C API's
    ``ump_scope_begin``/``ump_scope_end`` frees every live block of the scope: that is for C
    code that owns its pointers.
    """

    def __init__(self, collect: bool = False) -> None:
        self.collect = collect
        self.report: ScopeReport | None = None

    def __enter__(self) -> "scope":
        _lib.check(_lib.lib().ump_scope_begin_ex(_lib.SCOPE_KEEP_LIVE), "ump_scope_begin_ex")
        self.report = None
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self.collect:
            import gc

            gc.collect()
        r = _lib.ScopeReport()
        r.size = ctypes.sizeof(_lib.ScopeReport)
        _lib.check(_lib.lib().ump_scope_end_ex(ctypes.byref(r)), "ump_scope_end_ex")
        self.report = ScopeReport(
            allocs=int(r.allocs),
            alloc_bytes=int(r.alloc_bytes),
            frees=int(r.frees),
            peak_bytes=int(r.peak_bytes),
            live_blocks=int(r.live_blocks),
            live_bytes=int(r.live_bytes),
        )
        return False
