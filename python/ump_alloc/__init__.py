"""ump-alloc: one allocator for NumPy, CuPy and PyTorch over memory both the CPU and the GPU
can reach.

Quick start::

    import ump_alloc
    ump_alloc.enable()          # NumPy, and CuPy / PyTorch where installed and a GPU is present
    ...
    with ump_alloc.enabled():   # or only inside a block
        ...

Or, with no code change: ``UMP_ALLOC=1 python program.py``.
"""

from __future__ import annotations

import contextlib as _contextlib
import ctypes as _ctypes
import dataclasses as _dataclasses
import os as _os
import warnings as _warnings

from . import _hooks, _lib
from ._lib import UmpError, last_error, library_path
from ._summary import memory_summary, pool_stats
from ._transfer import TransferPlan, decide_transfer

__all__ = [
    "UmpError",
    "Identity",
    "ZeroCopyBuffer",
    "asnumpy",
    "asarray",
    "is_zero_copy",
    "transfer_plan",
    "decide_transfer",
    "TransferPlan",
    "host_access",
    "device_access",
    "enable",
    "disable",
    "enabled",
    "is_enabled",
    "handles",
    "identify",
    "capabilities",
    "config_table",
    "config_errors",
    "unknown_variables",
    "library_path",
    "last_error",
    "clear_error",
    "error_count",
    "mode",
    "alignment",
    "block_alignment",
    "trim",
    "version",
    "stats",
    "memory_summary",
    "pool_stats",
    "reset_peak",
    "scope",
    "ScopeReport",
    "get_include",
    "get_libdir",
]



def version() -> str:
    """Version of the loaded library."""
    return _lib.lib().ump_version().decode()


def get_include() -> str:
    """The directory holding ``ump_alloc.h``, for C code that calls ump-alloc (like
    ``numpy.get_include()``): ``cc -I$(python -m ump_alloc --include) ...``."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    for d in (_os.path.join(here, "include"), _os.path.join(_os.path.dirname(_os.path.dirname(here)), "include")):
        if _os.path.isfile(_os.path.join(d, "ump_alloc.h")):
            return d
    raise UmpError("ump_alloc.h not found: install the package (a built wheel, or pip install . in a checkout)", _lib.ERR_CONFIG)


def get_libdir() -> str:
    """The directory holding the ``libump_alloc.so`` this package loads, for linking C code
    against it: ``cc ... -L$(python -m ump_alloc --libdir) -Wl,-rpath,$(...) -lump_alloc``. Its
    ``lib/pkgconfig`` holds ``ump_alloc.pc`` in an installed package."""
    return _os.path.dirname(library_path())


def _init() -> None:
    _warn_unknown_vars()
    _lib.check(_lib.lib().ump_init(), "ump_init")


def config_errors() -> list[str]:
    """Problems with the ``UMP_ALLOC_*`` environment, without initialising: the configuration
    error (which stops ump-alloc from starting: a malformed value, or a mode or side this
    machine cannot do, the verdict a program run with ``UMP_ALLOC=1`` gets), and a line per
    variable ump-alloc does not know (a misspelling, with the closest known name)."""
    out = []
    if _lib.lib().ump_config_check() != _lib.OK:
        msg = (last_error() or "invalid UMP_ALLOC_* setting").removeprefix("ump_config_check: ")
        out.append(f"configuration error: {msg}")
        clear_error()
    if _os.environ.get("UMP_ALLOC_NUMPY_ROUTE", "").strip() == "numpy_allocator" and not _installed("numpy_allocator"):
        out.append("configuration error: UMP_ALLOC_NUMPY_ROUTE=numpy_allocator, but numpy_allocator is not "
                   "installed: pip install numpy_allocator, or unset UMP_ALLOC_NUMPY_ROUTE")
    out += [_unknown_message(n, near) for n, near in unknown_variables()]
    return out


def unknown_variables() -> list[tuple[str, str | None]]:
    """``UMP_ALLOC*`` variables in the environment that ump-alloc does not read, each with the
    closest known name (or None)."""
    import difflib

    known = {row["name"] for row in _config_rows()}
    out = []
    for name in sorted(_os.environ):
        if name.startswith("UMP_ALLOC") and name not in known:
            near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            out.append((name, near[0] if near else None))
    return out


def _unknown_message(name: str, near: str | None) -> str:
    hint = f"; did you mean {near}?" if near else " (python -m ump_alloc info lists the variables)"
    return f"{name} is set but ump-alloc has no such variable{hint}"


_warned_unknown = False


def _warn_unknown_vars() -> None:
    global _warned_unknown
    if _warned_unknown:
        return
    _warned_unknown = True
    for name, near in unknown_variables():
        _warnings.warn(_unknown_message(name, near), RuntimeWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller of this function point at
    the first frame outside ump-alloc, its import hook, the import machinery and contextlib:
    the program's ``enable()`` call, or under ``UMP_ALLOC=1`` the statement that imported
    NumPy (or CuPy, PyTorch)."""
    import sys

    here = _os.path.dirname(_os.path.abspath(__file__)) + _os.sep
    skip = ("importlib", "_ump_alloc_hooks.py", "contextlib.py")
    frame = sys._getframe(2)  # the caller of the function that warns: stacklevel 2
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        # warnings.warn does not count the import system's own frames (importlib._bootstrap).
        if not ("importlib" in name and "_bootstrap" in name):
            if not (_os.path.abspath(name).startswith(here) or any(k in name for k in skip)):
                return level
            level += 1
        frame = frame.f_back
    return 2


def mode() -> str:
    """The mode in force: a preset ('pinned', 'host', 'system', 'managed', 'registered',
    'device') or 'custom' (sides chosen one by one), or 'unset' before the first allocation.
    :func:`capabilities` says what memory each side has and why."""
    return _lib.MODE_NAMES.get(_lib.lib().ump_current_mode(), "unset")


def alignment() -> int:
    """Alignment of every block in bytes."""
    return int(_lib.lib().ump_alignment())


def block_alignment(nbytes: int) -> int:
    """The alignment of a NumPy array (or ``ump_malloc`` block) of ``nbytes`` bytes: the
    configured :func:`alignment` for blocks at least that large; a smaller block gets the
    natural alignment of its size class (the largest power of two dividing the class size, at
    least 16), so that small arrays do not pay for a GPU-sized alignment. CuPy and PyTorch
    blocks always get the full alignment."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, not {nbytes}")
    a = int(_lib.lib().ump_block_alignment(int(nbytes)))
    if a == 0:
        raise UmpError(last_error() or "ump_block_alignment failed", _lib.ERR_CONFIG)
    return a


def error_count() -> int:
    """Errors the library has counted (bad frees, double frees, bad sizes, OOM, ...)."""
    return int(_lib.lib().ump_error_count())


def clear_error() -> None:
    """Forget this thread's last error message."""
    _lib.lib().ump_clear_error()


def trim() -> int:
    """Give cached memory back to the OS and the driver. Returns the bytes given back."""
    return int(_lib.lib().ump_trim())


# ---- enabling ----------------------------------------------------------------------------------

@_dataclasses.dataclass
class _Frame:
    """One :func:`enable` call: what it switched over, and the environment variables it set
    for child processes (with their values before, to put back)."""

    libs: list
    env: dict
    auto: bool = False


_frames: list[_Frame] = []


def _gpu_mode() -> bool:
    return mode() not in ("host", "unset")


def _install_cupy(required: bool, zero_copy: bool | None = None) -> None:
    from . import _cupy

    if not _gpu_mode():
        if required:
            raise UmpError(f"CuPy needs a GPU mode; ump-alloc runs in mode '{mode()}'", _lib.ERR_UNSUPPORTED)
        return
    _cupy.install(zero_copy=zero_copy)


def _install_torch(
    required: bool,
    fast_cpu: bool | None = None,
    unified: bool | None = None,
    route: str | None = None,
) -> None:
    from . import _torch

    if not _gpu_mode():
        if required:
            raise UmpError(f"PyTorch needs a GPU mode; ump-alloc runs in mode '{mode()}'", _lib.ERR_UNSUPPORTED)
        return
    try:
        _torch.install(route=route, fast_cpu=fast_cpu, unified=unified)
    except _torch.TooLateError as e:
        if required:
            raise
        _warnings.warn(str(e), RuntimeWarning, stacklevel=3)
    except UmpError:
        if required:
            raise


def _installed(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _pth_installed() -> bool:
    import site
    import sys

    dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return any(_os.path.isfile(_os.path.join(d, "ump_alloc.pth")) for d in dirs)


def _child_env(
    mode: str | None,
    alignment: int | None,
    limit: int | str | None,
    cupy_zero_copy: bool | None,
    torch_fast_cpu: bool | None,
    torch_unified: bool | None,
    torch_route: str | None = None,
) -> dict:
    env = {"UMP_ALLOC": "1"}
    for name, value in (
        ("UMP_ALLOC_MODE", mode),
        ("UMP_ALLOC_ALIGNMENT", alignment),
        ("UMP_ALLOC_LIMIT", limit),
        ("UMP_ALLOC_TORCH_ROUTE", torch_route),
    ):
        if value is not None:
            env[name] = str(value)
    for name, flag in (
        ("UMP_ALLOC_CUPY_ZERO_COPY", cupy_zero_copy),
        ("UMP_ALLOC_TORCH_FAST_CPU", torch_fast_cpu),
        ("UMP_ALLOC_TORCH_UNIFIED", torch_unified),
    ):
        if flag is not None:
            env[name] = "1" if flag else "0"
    return env


def enable(
    *,
    numpy: bool = True,
    cupy: bool | None = None,
    torch: bool | None = None,
    mode: str | None = None,
    alignment: int | None = None,
    limit: int | str | None = None,
    threads: bool = True,
    children: bool = False,
    cupy_zero_copy: bool | None = None,
    torch_fast_cpu: bool | None = None,
    torch_unified: bool | None = None,
    torch_route: str | None = None,
) -> None:
    """Make ump-alloc the allocator of NumPy, CuPy and PyTorch.

    ``cupy`` and ``torch``: None (default) switches each over where it is installed and a GPU
    mode is in force, right away if it is imported and otherwise the moment it is imported;
    True requires it (errors raise); False leaves it alone. ``threads``: every thread of the
    process allocates NumPy arrays from ump-alloc, those that exist already included (NumPy's
    default handler dispatches to ump-alloc while enabled), except a thread that set a NumPy
    handler of its own; ``threads=False``: only the calling thread's context.

    ``mode``, ``alignment`` and ``limit`` stand for ``UMP_ALLOC_MODE``, ``UMP_ALLOC_ALIGNMENT``
    and ``UMP_ALLOC_LIMIT`` (same syntax: ``limit=8 << 30`` or ``limit="8G"``, ``"none"``) and
    override them. They are fixed at the first allocation; a later, different value raises
    UmpError.

    ``children=True`` also reaches child processes that start a new interpreter
    (``multiprocessing`` with ``spawn`` or ``forkserver``, ``subprocess`` running Python): it
    sets ``UMP_ALLOC=1`` and the settings given here in ``os.environ``, which those children
    inherit, and :func:`disable` puts the variables back. It needs ``ump_alloc.pth`` in
    site-packages (installing the package with pip puts it there). ``fork`` children need nothing:
    they inherit the parent's state.

    Calls nest: each ``enable()`` is undone by one :func:`disable`, innermost first, and the
    state before the outermost ``enable()`` comes back after the last ``disable()``.

    ``torch_route`` (None: ``UMP_ALLOC_TORCH_ROUTE``, default ``"segments"``): how PyTorch gets
    ump-alloc memory. ``"segments"``: PyTorch keeps its own caching allocator (every
    ``torch.cuda`` feature works) and ump-alloc supplies its segments, from any moment on
    (segments made before stay PyTorch's). ``"swap"``: ump-alloc replaces PyTorch's allocator;
    PyTorch accepts that only before its first CUDA tensor (later ``torch=True`` raises and
    ``torch=None`` warns), and some ``torch.cuda`` calls then raise
    (``ump_alloc._torch.SWAP_UNSUPPORTED``; the PyTorch guide lists them).

    ``cupy_zero_copy``, ``torch_fast_cpu``, ``torch_unified`` (None: the ``UMP_ALLOC_*`` variable
    of that name): CuPy's ``asnumpy``/``get``/``asarray`` as views of ump-alloc memory (off by
    default); PyTorch's ``.cpu()`` into pinned memory (on by default); ``.to(device)`` without a
    copy where both processors reach the memory (RFC-0023, off by default). The README's
    "Transfers" section lists what each changes.
    """
    for name, wanted in (("cupy", cupy), ("torch", torch)):
        if wanted and not _installed(name):
            raise UmpError(
                f"enable({name}=True): {name} is not installed in this environment "
                f"(pip install {'cupy-cuda12x' if name == 'cupy' else 'torch'}, or pass {name}=None to "
                "switch it over only where it is installed)",
                _lib.ERR_UNSUPPORTED,
            )
    if children and not _pth_installed():
        raise UmpError(
            "enable(children=True) needs ump_alloc.pth in site-packages, which switches ump-alloc "
            "on in a child interpreter; install the package with pip (a built wheel, or "
            "pip install . from a checkout)",
            _lib.ERR_UNSUPPORTED,
        )
    L = _lib.lib()
    if alignment is not None:
        _setting("alignment", alignment, "ump_set_alignment", lambda: L.ump_set_alignment(int(alignment)))
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, str)):
            raise TypeError(f"limit is a byte count or a string such as '8G' or 'none', not {limit!r}")
        _setting("limit", limit, "ump_set_limit", lambda: L.ump_set_limit(str(limit).encode()))
    if mode is not None:
        _setting("mode", mode, "ump_set_mode", lambda: L.ump_set_mode(str(mode).encode()))
    _init()
    done: list[str] = []
    if numpy:
        from . import _numpy

        _numpy.install(threads=threads)
        done.append("numpy")
    if cupy or (cupy is None and _installed("cupy")):
        _hooks.when_imported("cupy", lambda _m, req=bool(cupy): _install_cupy(req, cupy_zero_copy))
        done.append("cupy")
    if torch_route is not None:
        from ._torch import route_setting

        route_setting(torch_route)  # a bad value raises here, not at PyTorch's import
    if torch or (torch is None and _installed("torch")):
        _hooks.when_imported(
            "torch",
            lambda _m, req=bool(torch): _install_torch(req, torch_fast_cpu, torch_unified, torch_route),
        )
        done.append("torch")
    env: dict = {}
    if children:
        _warn_if_forkserver_running()
        wanted_env = _child_env(
            mode, alignment, limit, cupy_zero_copy, torch_fast_cpu, torch_unified, torch_route
        )
        env = {k: _os.environ.get(k) for k in wanted_env}
        _os.environ.update(wanted_env)
    _frames.append(_Frame(done, env))


def _setting(keyword: str, value, function: str, call) -> None:
    """Apply one of :func:`enable`'s settings through the library; a refusal raises UmpError
    naming the keyword and its value (``enable(mode='managed'): ...``), not the C function."""
    status = call()
    if status != _lib.OK:
        msg = (last_error() or f"{function} failed with {_lib.STATUS_NAMES.get(status, status)}")
        raise UmpError(f"enable({keyword}={value!r}): {msg.removeprefix(function + ': ')}", status)


def _warn_if_forkserver_running() -> None:
    import sys

    fs = sys.modules.get("multiprocessing.forkserver")
    server = getattr(fs, "_forkserver", None)
    if server is not None and getattr(server, "_forkserver_pid", None) is not None:
        _warnings.warn(
            "enable(children=True): multiprocessing's forkserver was started before this call and "
            "keeps the environment it started with, so its children will not use ump-alloc; call "
            "enable(children=True) before the first forkserver process starts (or use 'spawn')",
            RuntimeWarning,
            stacklevel=3,
        )


def _enable_auto(**libs) -> None:
    """``UMP_ALLOC=1``: what the import hooks switch over joins one frame, at the bottom of
    the stack, so that one :func:`disable` undoes it all (and a program's own ``enable()`` calls
    still nest above it)."""
    enable(**libs)
    frame = _frames.pop()
    for f in _frames:
        if f.auto:
            f.libs.extend(x for x in frame.libs if x not in f.libs)
            return
    frame.auto = True
    _frames.insert(0, frame)


def disable() -> None:
    """Undo the innermost :func:`enable` (or, with ``UMP_ALLOC=1``, what it switched on) for
    NumPy, CuPy and PyTorch, and the environment variables it set for children. Arrays made
    meanwhile stay valid and are freed through ump-alloc. PyTorch on the ``segments`` route
    takes its new segments from CUDA again (those it holds from ump-alloc go back to ump-alloc
    when it releases them); the ``swap`` route cannot be undone and stays. A ``disable()``
    without a matching ``enable()`` raises UmpError."""
    if not _frames:
        raise UmpError(
            "disable() without a matching enable(): ump-alloc is not enabled here "
            "(each enable() is undone by one disable())",
            _lib.ERR_INVALID,
        )
    frame = _frames.pop()
    if "numpy" in frame.libs:
        from . import _numpy

        _numpy.uninstall()
    if "cupy" in frame.libs and not any("cupy" in f.libs for f in _frames):
        _hooks.cancel("cupy")
        from . import _cupy

        _cupy.uninstall()
    if "torch" in frame.libs and not any("torch" in f.libs for f in _frames):
        _hooks.cancel("torch")
        import sys

        if "torch" in sys.modules:
            from . import _torch

            _torch.uninstall()
    for k, v in frame.env.items():
        if v is None:
            _os.environ.pop(k, None)
        else:
            _os.environ[k] = v


@_contextlib.contextmanager
def enabled(**kwargs):
    """``with ump_alloc.enabled(): ...`` enables ump-alloc inside the block only (it takes
    :func:`enable`'s arguments)."""
    enable(**kwargs)
    try:
        yield
    finally:
        disable()


def is_enabled() -> bool:
    """Whether ump-alloc is NumPy's allocator in this thread."""
    from . import _numpy

    return _numpy.active()


def handles(array) -> bool:
    """Whether NumPy ``array`` (or the array a view looks into) was allocated by ump-alloc.
    Anything but a NumPy array raises TypeError, before and after :func:`enable` alike."""
    from . import _numpy

    return _numpy.handles(array)


# ---- identity and capabilities ------------------------------------------------------------------


@_dataclasses.dataclass(frozen=True)
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
        where = f"device {self.device}" if self.device >= 0 else "host"
        block = f" block {self.base:#x}+{self.size}" if self.base else ""
        access = ", ".join(n for n, ok in (("host", self.host_accessible), ("device", self.device_accessible)) if ok)
        return (
            f"<Identity {self.address:#x}: {'ours' if self.ours else 'not ours'}, {self.kind}, {where},"
            f"{block} reachable by: {access or 'nobody known'}>"
        )


def _address(obj) -> int:
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
    if isinstance(obj, _ctypes.c_void_p):
        return int(obj.value or 0)
    raise TypeError(f"cannot take the address of {type(obj).__name__}")


def identify(obj) -> Identity:
    """Identify an address, a NumPy/CuPy array or a torch tensor (by its data pointer)."""
    addr = _address(obj)
    out = _lib.Identity()
    out.size = _ctypes.sizeof(_lib.Identity)
    _lib.check(_lib.lib().ump_identify(_ctypes.c_void_p(addr), _ctypes.byref(out)), "ump_identify")
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


def host_access(obj, nbytes: int | None = None, stream=None, *, touch=None) -> None:
    """C ``ump_host_access_ex`` on an address (with ``nbytes``) or an array: wait for ``stream``
    (a handle, a CuPy/torch stream, or None for the legacy default stream) and move managed
    pages to the host as the transfer plan says for a host that reads ``touch`` of them (None:
    all; large ranges then migrate in the background while the host reads; a small fraction
    such as 0.01: nothing moves, the pages it touches fault over)."""
    from ._transfer import check_touch
    from ._zerocopy import _stream_handle

    t = check_touch(touch)
    addr = _address(obj)
    n = nbytes if nbytes is not None else int(getattr(obj, "nbytes", 0))
    h = _stream_handle(stream, lambda: 0)
    _lib.check(_lib.lib().ump_host_access_ex(_ctypes.c_void_p(addr), n, _ctypes.c_void_p(h), t), "ump_host_access_ex")


def device_access(obj, nbytes: int | None = None, device: int = 0, stream=None, *, touch=None) -> None:
    """C ``ump_device_access_ex``: prefetch managed memory toward ``device`` in ``stream`` order,
    no host wait (not for kernels that touch only a small fraction, ``touch``, of it: their
    pages fault over)."""
    from ._transfer import check_touch
    from ._zerocopy import _stream_handle

    t = check_touch(touch)
    addr = _address(obj)
    n = nbytes if nbytes is not None else int(getattr(obj, "nbytes", 0))
    h = _stream_handle(stream, lambda: 0)
    _lib.check(
        _lib.lib().ump_device_access_ex(_ctypes.c_void_p(addr), n, int(device), _ctypes.c_void_p(h), t),
        "ump_device_access_ex",
    )


def capabilities() -> dict:
    """The machine's capabilities and the mode (in force, or that would be chosen).
    ``fork_shared``: NumPy's pinned pages are shared with ``fork()`` children rather than copied
    into them (``UMP_ALLOC_PINNED_FORK``); ``fork_rule``: what a fork child gets of NumPy's
    memory and what it sees."""
    c = _lib.Capabilities()
    c.size = _ctypes.sizeof(_lib.Capabilities)
    _lib.check(_lib.lib().ump_capabilities(_ctypes.byref(c)), "ump_capabilities")
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
    }


def config_table() -> list[dict]:
    """Every UMP_ALLOC_* variable: ``name``, ``default``, ``help`` (its meaning), ``value`` (as
    typed in the environment, or None) and ``parsed``: what the library makes of the value in
    force, the value or else the default (``"8 GiB (8589934592 bytes)"`` for ``8GB``), or None
    when the value is invalid (:func:`config_errors` says why)."""
    rows = _config_rows()
    for row in rows:
        value = row["value"]
        row["parsed"] = _describe(row["name"], value if value is not None and value.strip() else row["default"])
    return rows


def _config_rows() -> list[dict]:
    """:func:`config_table` without ``parsed``."""
    L = _lib.lib()
    rows = []
    i = 0
    while True:
        name, default, help_ = _ctypes.c_char_p(), _ctypes.c_char_p(), _ctypes.c_char_p()
        if L.ump_config_var(i, _ctypes.byref(name), _ctypes.byref(default), _ctypes.byref(help_)) != _lib.OK:
            break
        n = name.value.decode()
        rows.append({"name": n, "default": default.value.decode(), "help": help_.value.decode(), "value": _os.environ.get(n)})
        i += 1
    L.ump_clear_error()  # the row past the end is reported as an error
    return rows


def _describe(name: str, value: str) -> str | None:
    """``ump_config_describe``: what ``value`` means for variable ``name``, or None if invalid."""
    buf = _ctypes.create_string_buffer(256)
    if _lib.lib().ump_config_describe(name.encode(), value.encode(), buf, len(buf)) != _lib.OK:
        clear_error()
        return None
    return buf.value.decode(errors="replace")


# ---- statistics ----------------------------------------------------------------------------------


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
    s.size = _ctypes.sizeof(_lib.Stats)
    _lib.check(_lib.lib().ump_stats(_ctypes.byref(s)), "ump_stats")
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


# ---- scopes ----------------------------------------------------------------------------------------


@_dataclasses.dataclass
class ScopeReport:
    """What a :func:`scope` saw. ``live_blocks``/``live_bytes``: blocks allocated in the scope
    and still referenced at its end (they escaped the scope and stay valid)."""

    allocs: int = 0
    alloc_bytes: int = 0
    frees: int = 0
    peak_bytes: int = 0
    live_blocks: int = 0
    live_bytes: int = 0


class scope(_contextlib.ContextDecorator):
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

    def __init__(self, collect: bool = False):
        self.collect = collect
        self.report: ScopeReport | None = None

    def __enter__(self) -> "scope":
        _lib.check(_lib.lib().ump_scope_begin_ex(_lib.SCOPE_KEEP_LIVE), "ump_scope_begin_ex")
        self.report = None
        return self

    def __exit__(self, *exc) -> bool:
        if self.collect:
            import gc

            gc.collect()
        r = _lib.ScopeReport()
        r.size = _ctypes.sizeof(_lib.ScopeReport)
        _lib.check(_lib.lib().ump_scope_end_ex(_ctypes.byref(r)), "ump_scope_end_ex")
        self.report = ScopeReport(
            allocs=int(r.allocs),
            alloc_bytes=int(r.alloc_bytes),
            frees=int(r.frees),
            peak_bytes=int(r.peak_bytes),
            live_blocks=int(r.live_blocks),
            live_bytes=int(r.live_bytes),
        )
        return False


_LAZY = {"ZeroCopyBuffer", "asarray", "asnumpy", "is_zero_copy", "transfer_plan"}


def __getattr__(name: str):
    if name == "__version__":
        # One source: Cargo.toml, compiled into the library (the package metadata reads it too).
        try:
            return version()
        except (UmpError, OSError):
            from importlib.metadata import PackageNotFoundError
            from importlib.metadata import version as _dist_version

            try:
                return _dist_version("ump-alloc")
            except PackageNotFoundError:
                return "unknown"
    # The zero-copy functions import NumPy: loaded on first use, so that ``import ump_alloc``
    # (and UMP_ALLOC=1's hook, which imports it at NumPy's import) imports no NumPy itself.
    if name in _LAZY:
        from . import _zerocopy

        return getattr(_zerocopy, name)
    raise AttributeError(f"module 'ump_alloc' has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | _LAZY)


del annotations  # from __future__; keep the namespace to the public API
