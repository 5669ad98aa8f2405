"""Making memory safe for the other side to read without a copy: :func:`host_access` and
:func:`device_access` (``ump_host_access_ex``, ``ump_device_access_ex``), as the transfer plan
says for the reader's ``touch``."""

from __future__ import annotations

import ctypes

from . import _lib
from ._identity import address


def host_access(obj: object, nbytes: int | None = None, stream: object = None, *, touch: float | None = None) -> None:
    """C ``ump_host_access_ex`` on an address (with ``nbytes``) or an array: wait for ``stream``
    (a handle, a CuPy/torch stream, or None for the legacy default stream) and move managed
    pages to the host as the transfer plan says for a host that reads ``touch`` of them (None:
    all; large ranges then migrate in the background while the host reads; a small fraction
    such as 0.01: nothing moves, the pages it touches fault over)."""
    from ._transfer import check_touch
    from ._zerocopy import _stream_handle

    t = check_touch(touch)
    addr = address(obj)
    n = nbytes if nbytes is not None else int(getattr(obj, "nbytes", 0))
    h = _stream_handle(stream, lambda: 0)
    _lib.check(_lib.lib().ump_host_access_ex(ctypes.c_void_p(addr), n, ctypes.c_void_p(h), t), "ump_host_access_ex")


def device_access(
    obj: object, nbytes: int | None = None, device: int = 0, stream: object = None, *, touch: float | None = None
) -> None:
    """C ``ump_device_access_ex``: prefetch managed memory toward ``device`` in ``stream`` order,
    no host wait (not for kernels that touch only a small fraction, ``touch``, of it: their
    pages fault over)."""
    from ._transfer import check_touch
    from ._zerocopy import _stream_handle

    t = check_touch(touch)
    addr = address(obj)
    n = nbytes if nbytes is not None else int(getattr(obj, "nbytes", 0))
    h = _stream_handle(stream, lambda: 0)
    _lib.check(
        _lib.lib().ump_device_access_ex(ctypes.c_void_p(addr), n, int(device), ctypes.c_void_p(h), t),
        "ump_device_access_ex",
    )
