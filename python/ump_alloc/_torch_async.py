"""``non_blocking=True`` copies to the GPU from ump-alloc's memory: the source is kept until the
copy ran.

On pageable memory PyTorch's ``.to("cuda", non_blocking=True)`` and ``.cuda(non_blocking=True)``
have read the source before they return, so a program may drop it at once
(``torch.from_numpy(a * 2).cuda(non_blocking=True)``). On ump-alloc's pinned host side the copy
is a real asynchronous DMA, and NumPy would hand the freed memory to the next array before the
copy read it (measured on the H200: 9 of 9 copies wrong behind a busy stream). So
``_torch_transfer``'s ``.to``/``.cuda`` hand such calls to :func:`guarded`, which keeps the
source's *storage* (a Parameter's data is swapped by ``Module.to``) until an event recorded
after the copy on the destination's current stream has completed, as PyTorch's own pinned
allocator does for its blocks.

The sources are kept per stream, in order: a stream's events complete in order, so letting go
stops at a stream's first copy not done, and streams do not wait for each other. Each guarded
call lets go of what is done, other calls once every ``DROP_EVERY``; past ``HOLD_CAP_BYTES``
the oldest copies are waited for (what a pageable copy costs). Nothing here raises into the
program: a source that cannot be held gets its stream synchronised instead, and a lost context
keeps what it holds. Nothing is recorded or asked while the calling thread's stream captures a
CUDA graph. A fork child starts with nothing held and never asks the parent's events.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading

DROP_EVERY = 64
HOLD_CAP_BYTES = 1 << 30

# stream key -> deque of (event, storage, bytes, sequence number), in the order of the copies.
_by_stream: dict = {}
# Re-entrant: a storage's release or a collection inside may run Python that copies again.
_lock = threading.RLock()
_seq = itertools.count()
# Sources held and their bytes, as plain ints the fast paths (and torch.compile) read cheaply.
_held = [0]
_held_bytes = [0]
_calls = [0]
# What a fork child inherited: the parent's events, which the child cannot use (not even to
# destroy them); kept untouched to the child's exit.
_inherited: list = []


def _after_fork_in_child() -> None:
    global _by_stream, _lock
    if _by_stream:
        _inherited.append(_by_stream)
    _by_stream = {}
    _lock = threading.RLock()
    _held[0] = _held_bytes[0] = 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def held() -> int:
    """Sources of ``non_blocking`` copies to the GPU still kept alive."""
    return _held[0]


def non_blocking(args, kwargs) -> bool:
    """Whether a ``.to``/``.cuda`` call may ask for ``non_blocking`` (cheap, no parsing; a
    positional ``True`` may also be ``copy``, which only keeps a source alive a little longer).
    NumPy's ``True_`` counts, as PyTorch takes it."""
    if kwargs and kwargs.get("non_blocking", False):
        return True
    for a in args:
        if a is True or (type(a).__name__ in ("bool", "bool_") and a):
            return True
    return False


def guarded(fn, src, args, kwargs, torch):
    """``fn(src, *args, **kwargs)``, a ``non_blocking`` copy of CPU tensor ``src`` (maybe to a
    GPU), with ``src``'s storage kept until the copy ran where that matters."""
    if _held[0]:
        drop_copied(torch)
    dst = fn(src, *args, **kwargs)
    keep_until_copied(src, dst, torch)
    return dst


def drop_now_and_then(torch) -> None:
    """For the other ``.to``/``.cuda`` calls of CPU tensors: let go of what is done, once every
    ``DROP_EVERY`` calls."""
    _calls[0] += 1
    if _held[0] and _calls[0] % DROP_EVERY == 0:
        drop_copied(torch)


def _capturing(torch) -> bool:
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - a lost context: ask nothing
        return True


def keep_until_copied(src, dst, torch) -> None:
    """``dst`` is a copy of CPU tensor ``src`` made with ``non_blocking``: when ``dst`` is on a
    GPU and ``src``'s storage starts at a block of ump-alloc's, keep the storage until an event
    recorded after the copy on ``dst``'s current stream has completed."""
    if dst is src or not isinstance(dst, torch.Tensor) or not dst.is_cuda:
        return
    try:
        if src.layout is not torch.strided or src.numel() == 0:
            return  # sparse and other layouts have no single storage to hold
        if _capturing(torch):
            # A CUDA graph's copy node reads the source at every replay: keeping it is the
            # program's business, and an event recorded now would join the capture.
            return
        # ump_owns: a registry lookup (no driver call, unlike identify's for PyTorch's own
        # pinned memory: about 1 against 4.5 us). It knows block starts: a tensor made with
        # torch.from_numpy of a whole array, the case of a dropped temporary. A block of ours
        # not pinned (made before the first use of a GPU) is held too, harmlessly.
        import ctypes

        from . import _lib

        storage = src.untyped_storage()
        if not _lib.lib().ump_owns(ctypes.c_void_p(storage.data_ptr())):
            return  # PyTorch's own memory, plain host memory, or a view into a block
        stream = torch.cuda.current_stream(dst.device)
        ev = torch.cuda.Event()
        ev.record(stream)
        key = (stream.device_index, stream.cuda_stream)
    except Exception:  # noqa: BLE001 - the copy must stay safe, and the call must not raise
        try:
            torch.cuda.current_stream(dst.device).synchronize()
        except Exception:  # noqa: BLE001 - a lost context: nothing left to protect
            pass
        return
    hold(key, ev, storage, src.nbytes)
    if _held_bytes[0] > HOLD_CAP_BYTES:
        drop_copied(torch, wait_over=HOLD_CAP_BYTES)


def hold(key, ev, storage, nbytes: int) -> None:
    """Keep ``storage`` until ``ev`` (recorded on the stream ``key``) has completed."""
    entry = (ev, storage, nbytes, next(_seq))
    with _lock:
        _by_stream.setdefault(key, collections.deque()).append(entry)
        _held[0] += 1
        _held_bytes[0] += nbytes


def drop_copied(torch=None, wait_over: int | None = None) -> None:
    """Let go of every source whose copy has completed, stream by stream. With ``wait_over``,
    then wait for the oldest copies until at most that many bytes stay held (the waits happen
    outside the lock). Raises nothing; another thread already at it is left to it."""
    if torch is not None and _capturing(torch):
        return  # an event asked now would be refused, or join the capture: later
    if not _lock.acquire(blocking=False):
        return
    done, wait = [], []
    try:
        for key, q in list(_by_stream.items()):
            while q:
                try:
                    ok = q[0][0].query()
                except Exception:  # noqa: BLE001 - a lost context: keep it, ask no more
                    ok = False
                if not ok:
                    break
                done.append(q.popleft())
            if not q:
                del _by_stream[key]
        for e in done:
            _held[0] -= 1
            _held_bytes[0] -= e[2]
        while wait_over is not None and _held_bytes[0] > wait_over and _by_stream:
            key = min(_by_stream, key=lambda k: _by_stream[k][0][3])  # the oldest copy
            e = _by_stream[key].popleft()
            if not _by_stream[key]:
                del _by_stream[key]
            wait.append(e)
            _held[0] -= 1
            _held_bytes[0] -= e[2]
    finally:
        _lock.release()
    for e in wait:
        try:
            e[0].synchronize()
        except Exception:  # noqa: BLE001 - a lost context: nothing left to protect
            pass
    del done, wait  # the storages (and NumPy's buffers) are released here, outside the lock


def release_all(torch) -> None:
    """Wait for every copy held and let go of its source (when the patch is taken away)."""
    drop_copied(torch, wait_over=0)
