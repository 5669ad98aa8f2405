"""``ump_alloc.memory_summary()``: a readable table of what ump-alloc holds, like
``torch.cuda.memory_summary()``."""

from __future__ import annotations

import ctypes

from . import _lib


def pool_stats() -> list[dict]:
    """One dict per pool: the host side's pools (``device`` -1; ``fallback`` marks the plain
    host memory used when the host side's own kind was not available), then each device's, one
    per stream (``stream``: the handle, 0 for the legacy default stream; ``retired``). Each has
    ``mapped`` (bytes of physical memory it holds), ``reserved`` (bytes of address space its
    chunks hold: more than ``mapped`` for a virtual-memory pool), ``cached`` (free bytes ready
    for reuse), ``largest_free`` (the largest request it serves without mapping more) and
    ``kind`` (the memory it is made of: PyTorch's segments may be plain ``device`` memory beside
    the device side's pools)."""
    L = _lib.lib()
    out = []
    i = 0
    while True:
        s = _lib.PoolStat()
        s.size = ctypes.sizeof(_lib.PoolStat)
        if L.ump_pool_stat(i, ctypes.byref(s)) != _lib.OK:
            break
        out.append(
            {
                "device": int(s.device),
                "fallback": bool(s.fallback),
                "retired": bool(s.retired),
                "stream": int(s.stream or 0),
                "mapped": int(s.mapped),
                "cached": int(s.cached),
                "largest_free": int(s.largest_free),
                "reserved": int(s.reserved),
                "kind": _lib.KIND_NAMES.get(s.kind, "unknown"),
            }
        )
        i += 1
    L.ump_clear_error()  # the index past the end is reported as an error
    return out


def _size(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def _count(n) -> str:
    return "-" if n is None else f"{n:,}"


COLUMNS = ("in use", "cached", "mapped", "reserved", "peak", "largest free", "frag", "hits", "misses")


def _frag(largest, cached) -> str:
    """Fragmentation of a cache: 1 - largest free block / cached bytes."""
    return "-" if not cached else f"{1.0 - min(1.0, largest / cached):.0%}"


def memory_summary() -> str:
    """A table of ump-alloc's memory: per side (the host side for NumPy, with its fallback and
    pinned bytes; the device side for CuPy/PyTorch/Numba), per device and per stream: bytes in
    use, cached (free, ready for reuse), mapped (physical memory taken from the OS or the
    driver), reserved (address space: more than mapped for a virtual-memory pool), the peak in
    use, the largest free block, fragmentation (1 - largest free / cached), cache hits and
    misses. Per stream, "in use" is what it maps minus what is free in it (block sizes as
    rounded by the pool)."""
    from ._runtime import mode
    from ._stats import stats

    st = stats()
    pools = pool_stats()
    rows: list[tuple[str, tuple]] = []

    def usage_row(label, u):
        rows.append((label, (_size(u["in_use"]), _size(u["cached"]), _size(u["mapped"]), _size(u["reserved"]),
                             _size(u["in_use_peak"]), _size(u["largest_free"]), _frag(u["largest_free"], u["cached"]),
                             _count(u["hits"]), _count(u["misses"]))))

    def pool_row(label, p, in_use, allocs="-"):
        rows.append((label, (in_use, _size(p["cached"]), _size(p["mapped"]), _size(p["reserved"]), "-",
                             _size(p["largest_free"]), _frag(p["largest_free"], p["cached"]), allocs, "-")))

    host_pools = [p for p in pools if p["device"] < 0]
    usage_row(f"host side (NumPy): {st['host_kind']}", st["host"])
    fb = [p for p in host_pools if p["fallback"]]
    if fb or st["host_fallback"]["allocs"]:
        f = fb[0] if fb else {"mapped": 0, "cached": 0, "largest_free": 0, "reserved": 0}
        pool_row("  fallback (plain host memory)", f, "-", _count(st["host_fallback"]["allocs"]))
    if st["host_kind"] == "registered":
        pinned = "" if _lib.lib().ump_host_pinned() else " (not pinned yet: no GPU used in this process)"
        rows.append((f"  pinned: {_size(st['pinned']['bytes'])} of cap {_size(st['pinned']['cap'])}{pinned}", None))
    held = st["fork_held"]
    if held["blocks"]:
        rows.append((f"  held back for fork() children: {_size(held['bytes'])} in {_count(held['blocks'])} "
                     "blocks (freed here, still readable by a child)", None))
    if not st["devices"]:
        rows.append(("device side: nothing allocated (no GPU, host mode, or no GPU library used)", None))
    for dev, u in sorted(st["devices"].items()):
        mine = [p for p in pools if p["device"] == dev]
        usage_row(f"device {dev} ({st['device_kind']})", u)
        for p in sorted(mine, key=lambda p: (p["kind"] != st["device_kind"], p["stream"])):
            name = "legacy default" if p["stream"] == 0 else f"{p['stream']:#x}"
            if p["retired"]:
                name += " (retired)"
            if p["kind"] != st["device_kind"]:
                name += f" ({p['kind']} memory: PyTorch's segments)"
            pool_row(f"  stream {name}", p, _size(p["mapped"] - p["cached"]))
    from . import _torch

    if _torch.active():
        rows.append((f"PyTorch: {_torch.route()} route: {_torch.reason()}", None))
    w = max([len(r[0]) for r in rows if r[1] is not None] + [30])
    cw = max([len(c) for c in COLUMNS] + [len(c) for _, cells in rows if cells is not None for c in cells])
    line = "=" * (w + 3 + (cw + 3) * len(COLUMNS))
    out = [line, f"ump-alloc memory summary: mode {mode()}, {st['streams']} stream pools, "
                 f"{st['stream_waits']} cross-stream waits, {st['stream_syncs']} syncs, {st['errors']['total']} errors",
           "-" * len(line),
           f"{'':<{w}} | " + " | ".join(f"{c:>{cw}}" for c in COLUMNS),
           "-" * len(line)]
    for label, cells in rows:
        if cells is None:
            out.append(label)
        else:
            out.append(f"{label:<{w}} | " + " | ".join(f"{c:>{cw}}" for c in cells))
    out.append(line)
    return "\n".join(out)
