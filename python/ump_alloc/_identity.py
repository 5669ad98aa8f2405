"""What ump-alloc knows of an address (:func:`identify`, ``ump_identify``) and of the machine
(:func:`capabilities`, ``ump_capabilities``)."""

from __future__ import annotations

import ctypes
import dataclasses

from . import _lib


@dataclasses.dataclass(frozen=True)
class Identity:
    """What ump-alloc knows of an address."""

    address: int
    ours: bool
    kind: str
    base: int
    size: int
    device: int
    host_accessible: bool
    device_accessible: bool

    def __repr__(self) -> str:
        # The kind of memory, then where it lives (the host, or the device it belongs to), once
        # where the one names the other: "host" memory on the host, "device" memory of device 0.
        where = f"device {self.device}" if self.device >= 0 else "host"
        what = where if where.split()[0] == self.kind else f"{self.kind}, {where}"
        parts = ["ours" if self.ours else "not ours", what]
        if self.base:
            parts.append(f"block {self.base:#x}+{self.size}")
        access = ", ".join(n for n, ok in (("host", self.host_accessible), ("device", self.device_accessible)) if ok)
        parts.append(f"reachable by: {access or 'nobody known'}")
        waiting = " (not pinned yet: no GPU used in this process)" if self.unpinned else ""
        return f"<Identity {self.address:#x}: {', '.join(parts)}{waiting}>"

    @property
    def unpinned(self) -> bool:
        """Pinned host memory waiting for the process's first use of a GPU
        (``UMP_ALLOC_PIN=lazy``): host memory only until then."""
        return self.ours and self.kind == "registered" and not self.device_accessible


def address(obj: object) -> int:
    """The address ``obj`` stands for: an integer as it is, a torch tensor's ``data_ptr()``, the
    data pointer of an object with ``__cuda_array_interface__`` or ``__array_interface__``
    (CuPy, NumPy), or a ``ctypes.c_void_p``'s value."""
    if isinstance(obj, int):
        if not 0 <= obj < 1 << 64:
            raise ValueError(f"an address is an integer in [0, 2**64), not {obj}")
        return obj
    if hasattr(obj, "data_ptr") and callable(obj.data_ptr):  # torch.Tensor
        return int(obj.data_ptr())
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        return int(cai["data"][0] or 0)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        return int(ai["data"][0] or 0)
    if isinstance(obj, ctypes.c_void_p):
        return int(obj.value or 0)
    raise TypeError(f"cannot take the address of {type(obj).__name__}")


def identify(obj: object) -> Identity:
    """Identify an address, a NumPy/CuPy array or a torch tensor (by its data pointer)."""
    addr = address(obj)
    out = _lib.Identity()
    out.size = ctypes.sizeof(_lib.Identity)
    _lib.check(_lib.lib().ump_identify(ctypes.c_void_p(addr), ctypes.byref(out)), "ump_identify")
    return Identity(
        address=addr,
        ours=bool(out.ours),
        kind=_lib.KIND_NAMES.get(out.kind, str(out.kind)),
        base=int(out.base),
        size=int(out.block_size),
        device=int(out.device),
        host_accessible=bool(out.host_accessible),
        device_accessible=bool(out.device_accessible),
    )


def pin_for_gpu(device: int = -1) -> None:
    """The program is about to hand NumPy memory to GPU ``device`` (-1: the current one) by a
    way ump-alloc does not see: pin the host side's memory now if it waits for the process's
    first use of a GPU (``UMP_ALLOC_PIN=lazy``). Nothing to do, or no GPU: no error."""
    if _lib.lib().ump_pin_host_side(int(device)) != _lib.OK:
        _lib.lib().ump_clear_error()  # no GPU here, or no such device: nothing to pin


def capabilities() -> dict:
    """The machine's capabilities and the mode (in force, or that would be chosen).
    ``fork_shared``: NumPy's pinned pages are shared with ``fork()`` children rather than copied
    into them (``UMP_ALLOC_PINNED_FORK``); ``fork_rule``: what a fork child gets of NumPy's
    memory and what it sees; ``host_pinned``: NumPy's memory is pinned as it is made now (with
    ``UMP_ALLOC_PIN=lazy``, only once this process used a GPU: before, it makes no CUDA
    context).

    It asks the CUDA driver about the devices, which starts the driver in this process (as
    ``torch.cuda.is_available()`` does): a ``fork()`` child made after it cannot use CUDA.
    :func:`identify`, :func:`stats`, :func:`memory_summary` and :func:`trim` do not start it."""
    c = _lib.Capabilities()
    c.size = ctypes.sizeof(_lib.Capabilities)
    _lib.check(_lib.lib().ump_capabilities(ctypes.byref(c)), "ump_capabilities")
    devices = []
    for d in c.devices[: min(c.device_count, _lib.MAX_DEVICES)]:
        devices.append(
            {
                "ordinal": d.ordinal,
                "name": d.name.decode(errors="replace"),
                "total_memory": int(d.total_memory),
                "pageable_memory_access": bool(d.pageable_memory_access),
                "uses_host_page_tables": bool(d.uses_host_page_tables),
                "concurrent_managed_access": bool(d.concurrent_managed_access),
                "host_register_supported": bool(d.host_register_supported),
                "host_pointer_for_registered_mem": bool(d.host_pointer_for_registered_mem),
            }
        )
    return {
        "version": int(c.version),
        "cuda_available": bool(c.cuda_available),
        "driver_version": int(c.driver_version),
        "has_prefetch_v2": bool(c.has_prefetch_v2),
        "device_count": int(c.device_count),
        "mode": _lib.MODE_NAMES.get(c.mode, "unset"),
        "mode_fixed": bool(c.mode_fixed),
        "mode_reason": c.mode_reason.decode(errors="replace"),
        "host_side": _lib.HOST_SIDE_NAMES.get(c.host_side, "unknown"),
        "host_reason": c.host_reason.decode(errors="replace"),
        "device_side": _lib.DEVICE_SIDE_NAMES.get(c.device_side, "unknown"),
        "device_reason": c.device_reason.decode(errors="replace"),
        "alignment": int(c.alignment),
        "devices": devices,
        "fork_shared": bool(c.fork_shared),
        "fork_rule": c.fork_rule.decode(errors="replace"),
        "host_pinned": bool(_lib.lib().ump_host_pinned()),
    }
