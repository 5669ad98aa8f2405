"""CuPy's ``CUPY_ENABLE_UMP`` behaviour for memory ump-alloc owns, on every machine
(``UMP_ALLOC_CUPY_ZERO_COPY=1`` or ``enable(cupy_zero_copy=True)``; off by default).

With it on:

- ``cupy.asnumpy(x)`` and ``x.get()`` (no ``out``; any ``stream``) return a NumPy *view* of
  ``x``'s memory, after synchronising the stream (``ump_host_access``), when ``x`` is ump-alloc
  memory the host can read (managed, pinned/registered, system). Otherwise they copy as before.
- ``cupy.asarray(a)`` of a NumPy array on ump-alloc memory the GPU can reach (the pinned host
  side; system memory with HMM/ATS), with no ``dtype``/``order`` change, returns a CuPy array on
  the same memory (ordered by ``ump_device_access`` on the current stream). Otherwise it copies.

Differences from a copy (the same as CuPy's own UMP mode): the result aliases the source, so
writes through either show in the other and the source stays alive while the view does;
``blocking=False`` is ignored for views (the stream is synchronised); kernels on pinned host
memory read it over PCIe, and the host's first reads of managed memory fault pages over, so a
view wins for data used once and loses for data reused many times (docs/BENCHMARKS.md).
"""

from __future__ import annotations

_orig: dict = {}


def _ours(ptr: int, need: str) -> bool:
    from ._identity import identify

    try:
        ident = identify(int(ptr))
    except Exception:  # noqa: BLE001
        return False
    return ident.ours and getattr(ident, need)


def install(cupy) -> None:
    """Patch ``cupy.asnumpy``, ``cupy.ndarray.get`` (where CuPy allows it) and ``cupy.asarray``."""
    if _orig:
        return
    from . import _zerocopy

    _orig.update(asnumpy=cupy.asnumpy, asarray=cupy.asarray, get=getattr(cupy.ndarray, "get", None), cupy=cupy)
    orig_asnumpy, orig_asarray, orig_get = _orig["asnumpy"], _orig["asarray"], _orig["get"]

    def asnumpy(a, stream=None, order="C", out=None, **kwargs):
        if out is None and isinstance(a, cupy.ndarray) and a.size and (order in ("C", "K", "A", None)):
            if (order != "C" or a.flags.c_contiguous) and _ours(a.data.ptr, "host_accessible"):
                return _zerocopy.asnumpy(a, stream=stream, copy=False)
        return orig_asnumpy(a, stream=stream, order=order, out=out, **kwargs)

    def get(self, stream=None, order="C", out=None, **kwargs):
        if out is None and self.size and (order != "C" or self.flags.c_contiguous):
            if _ours(self.data.ptr, "host_accessible"):
                return _zerocopy.asnumpy(self, stream=stream, copy=False)
        return orig_get(self, stream=stream, order=order, out=out, **kwargs)

    def asarray(a, dtype=None, order=None, **kwargs):
        import numpy as np

        if type(a) is np.ndarray and a.size and (dtype is None or np.dtype(dtype) == a.dtype):
            ptr = a.__array_interface__["data"][0]
            viewable = a.flags.writeable and ptr % a.dtype.alignment == 0  # else asarray copies
            if viewable and (order in (None, "K", "A") or (order == "C" and a.flags.c_contiguous)):
                from ._identity import pin_for_gpu

                pin_for_gpu()  # the first use of a GPU pins NumPy's memory: before the check
                if _ours(ptr, "device_accessible"):
                    return _zerocopy.asarray(a, like="cupy", copy=False)
        return orig_asarray(a, dtype=dtype, order=order, **kwargs)

    cupy.asnumpy = asnumpy
    cupy.asarray = asarray
    try:
        cupy.ndarray.get = get
        _orig["get_patched"] = True
    except (TypeError, AttributeError):  # an extension type: get() keeps copying
        _orig["get_patched"] = False


def uninstall() -> None:
    if not _orig:
        return
    cupy = _orig["cupy"]
    cupy.asnumpy, cupy.asarray = _orig["asnumpy"], _orig["asarray"]
    if _orig.get("get_patched"):
        cupy.ndarray.get = _orig["get"]
    _orig.clear()


def active() -> bool:
    return bool(_orig)
