"""The transfer plan: whether a view of the same memory or a stream-ordered DMA copy is the
faster way to hand data to the other side (``ump_plan_transfer`` / ``ump_decide_transfer``).

The decision is the library's (``src/transfer.rs``), so that C callers, ``ump_host_access_ex``
/ ``ump_device_access_ex`` and the Python package make the same one. This module turns it into
Python values; :mod:`ump_alloc._zerocopy` acts on it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import math

from . import _lib

DIRECTIONS = ("host", "device")
MEMORIES = ("pageable", "pinned", "managed", "device")
RESIDENTS = ("unknown", "host", "device")
PATHS = ("view", "copy")
MOVES = ("none", "prefetch", "background")


@dataclasses.dataclass(frozen=True)
class TransferPlan:
    """What ump-alloc does to hand data to the other side, and why.

    ``path`` is ``"view"`` (the same memory, after a stream synchronisation or a stream-ordered
    prefetch) or ``"copy"`` (a stream-ordered DMA copy into the other side's memory), whichever
    is faster for a reader that touches ``touch`` of the data. ``view_possible`` is False where
    only a copy can work (device memory for the host; pageable memory for a GPU without
    HMM/ATS). ``view_move`` is what a view does to managed pages (``"none"``: the pages the
    reader touches fault over; ``"prefetch"``; ``"background"``: migrated while the host reads).
    The facts it was made from: ``to`` (``"host"`` or ``"device"``), ``memory`` (``"pageable"``,
    ``"pinned"``, ``"managed"``, ``"device"``), ``resident`` (where the pages are:
    ``"host"``, ``"device"`` or ``"unknown"``), ``coherent`` (HMM/ATS), ``nbytes``, ``touch``.
    """

    path: str
    view_possible: bool
    view_move: str
    reason: str
    to: str
    memory: str
    resident: str
    coherent: bool
    nbytes: int
    touch: float


def check_touch(touch) -> float:
    """``touch`` as a float: None means 1 (the reader reads all of it once)."""
    if touch is None:
        return 1.0
    if isinstance(touch, bool):
        raise TypeError("touch is a fraction of the data the reader will touch (1: all of it), not a bool")
    try:
        t = float(touch)
    except (TypeError, ValueError):
        raise TypeError(f"touch is a fraction of the data the reader will touch (1: all of it), not {touch!r}") from None
    if not math.isfinite(t) or t < 0:
        raise ValueError(
            f"touch={touch!r}: give the fraction of the data the reader will touch, a finite number from 0 "
            "(0.01: a hundredth; 1: all of it once; 3: three passes)"
        )
    return t


def check_copy(copy) -> None:
    """``copy`` follows NumPy 2's ``asarray``: None (the faster), True (always a copy), False (never)."""
    if copy is not None and not isinstance(copy, bool):
        try:
            import numpy as np

            if isinstance(copy, np.bool_):
                return
        except ImportError:  # pragma: no cover - numpy is a dependency
            pass
        raise TypeError(f"copy must be None (the faster of a view and a copy), True or False, not {copy!r}")


def _plan_of(facts: _lib.TransferFacts, plan: _lib.TransferPlan) -> TransferPlan:
    return TransferPlan(
        path=PATHS[plan.path],
        view_possible=bool(plan.view_possible),
        view_move=MOVES[plan.view_move],
        reason=plan.reason.decode(errors="replace"),
        to=DIRECTIONS[facts.direction],
        memory=MEMORIES[facts.memory],
        resident=RESIDENTS[facts.resident],
        coherent=bool(facts.coherent),
        nbytes=int(facts.bytes),
        touch=float(facts.touch),
    )


def _structs():
    facts = _lib.TransferFacts()
    facts.size = ctypes.sizeof(_lib.TransferFacts)
    plan = _lib.TransferPlan()
    plan.size = ctypes.sizeof(_lib.TransferPlan)
    return facts, plan


def plan_range(ptr: int, nbytes: int, to: str, device: int = -1, touch=None) -> TransferPlan:
    """The plan for ``nbytes`` bytes at address ``ptr`` going ``to`` ``"host"`` or ``"device"``
    (``device``: the GPU that reads it, or that it comes from; -1: the memory's own)."""
    if to not in DIRECTIONS:
        raise ValueError(f"to must be 'host' or 'device', not {to!r}")
    t = check_touch(touch)
    facts, plan = _structs()
    _lib.check(
        _lib.lib().ump_plan_transfer(
            ctypes.c_void_p(ptr), int(nbytes), DIRECTIONS.index(to), int(device), t, ctypes.byref(facts),
            ctypes.byref(plan)
        ),
        "ump_plan_transfer",
    )
    return _plan_of(facts, plan)


def decide_transfer(
    to: str,
    memory: str,
    resident: str = "unknown",
    coherent: bool = False,
    nbytes: int = 1 << 30,
    touch: float | None = None,
) -> TransferPlan:
    """What ump-alloc decides for data of ``nbytes`` in ``memory`` (``"pageable"``, ``"pinned"``,
    ``"managed"``, ``"device"``) whose pages are ``resident`` on ``"host"``, ``"device"`` or
    ``"unknown"`` (the side it comes from), going ``to`` ``"host"`` or ``"device"`` on a
    machine that is ``coherent`` (HMM/ATS) or not, for a reader that touches ``touch`` of it.
    A pure function (C ``ump_decide_transfer``): it looks at no memory and no GPU, so it tells
    what any machine kind would do."""
    for name, value, allowed in (("to", to, DIRECTIONS), ("memory", memory, MEMORIES), ("resident", resident, RESIDENTS)):
        if value not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, allowed))}, not {value!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes < 1 << 64:
        raise ValueError(f"nbytes must be a byte count, not {nbytes!r}")
    facts, plan = _structs()
    facts.direction = DIRECTIONS.index(to)
    facts.memory = MEMORIES.index(memory)
    facts.resident = RESIDENTS.index(resident)
    facts.coherent = 1 if coherent else 0
    facts.bytes = nbytes
    facts.touch = check_touch(touch)
    _lib.check(_lib.lib().ump_decide_transfer(ctypes.byref(facts), ctypes.byref(plan)), "ump_decide_transfer")
    return _plan_of(facts, plan)
