"""Switching NumPy, CuPy and PyTorch over to ump-alloc and back: :func:`enable` (nesting, one
frame per call), :func:`disable`, :func:`enabled`, and what the ``UMP_ALLOC=1`` import hooks
switch on (:func:`enable_auto`, one frame at the bottom)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import warnings

from . import _hooks, _lib
from ._config import init, installed
from ._lib import UmpError, last_error
from ._runtime import mode

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

@dataclasses.dataclass
class _Frame:
    """One :func:`enable` call: what it switched over, and the environment variables it set
    for child processes (with their values before, to put back)."""

    libs: list
    env: dict
    auto: bool = False


_frames: list[_Frame] = []


def _gpu_mode() -> bool:
    """Whether the mode gives GPU libraries memory, asked without loading the CUDA driver where
    the sides chosen at start tell (CuPy's or PyTorch's import in a process that only uses
    NumPy, a spawn worker, must not pay the driver's start: about 0.5 s on the lent H100)."""
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
        warnings.warn(str(e), RuntimeWarning, stacklevel=3)
    except UmpError:
        if required:
            raise


def pth_installed() -> bool:
    """Whether ``ump_alloc.pth`` (which switches ump-alloc on in a child interpreter under
    ``UMP_ALLOC=1``) is in a site-packages directory of this interpreter."""
    import site
    import sys

    dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
    dirs += [p for p in sys.path if p.endswith("site-packages")]
    return any(os.path.isfile(os.path.join(d, "ump_alloc.pth")) for d in dirs)


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
        if wanted and not installed(name):
            raise UmpError(
                f"enable({name}=True): {name} is not installed in this environment "
                f"(pip install {'cupy-cuda12x' if name == 'cupy' else 'torch'}, or pass {name}=None to "
                "switch it over only where it is installed)",
                _lib.ERR_UNSUPPORTED,
            )
    if children and not pth_installed():
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
    init()
    done: list[str] = []
    if numpy:
        from . import _numpy

        _numpy.install(threads=threads)
        done.append("numpy")
    if cupy or (cupy is None and installed("cupy")):
        _hooks.when_imported("cupy", lambda _m, req=bool(cupy): _install_cupy(req, cupy_zero_copy))
        done.append("cupy")
    if torch_route is not None:
        from ._torch import route_setting

        route_setting(torch_route)  # a bad value raises here, not at PyTorch's import
    if torch or (torch is None and installed("torch")):
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
        env = {k: os.environ.get(k) for k in wanted_env}
        os.environ.update(wanted_env)
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
        warnings.warn(
            "enable(children=True): multiprocessing's forkserver was started before this call and "
            "keeps the environment it started with, so its children will not use ump-alloc; call "
            "enable(children=True) before the first forkserver process starts (or use 'spawn')",
            RuntimeWarning,
            stacklevel=3,
        )


def enable_auto(**libs: Any) -> None:
    """``UMP_ALLOC=1``: switch over the library being imported (the import hooks of
    ``_ump_alloc_hooks`` pass ``numpy=True``, ``cupy=None`` or ``torch=None``; the others stay
    off). What the import hooks switch over joins one frame, at the bottom of the stack, so that
    one :func:`disable` undoes it all (and a program's own ``enable()`` calls still nest above
    it). A failure raises :class:`UmpError` saying that ``UMP_ALLOC`` is set, and what to do."""
    try:
        enable(**{"numpy": False, "cupy": False, "torch": False, **libs})
    except UmpError as e:
        lib = next(k for k, v in libs.items() if v is not False)
        raise UmpError(
            f"UMP_ALLOC is set, but ump-alloc cannot switch {lib} over: {e}. Fix the setting "
            "(python -m ump_alloc info shows them all), or unset UMP_ALLOC to run without ump-alloc.",
            e.status,
        ) from None
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
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextlib.contextmanager
def enabled(**kwargs: Any) -> Iterator[None]:
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


def handles(array: object) -> bool:
    """Whether NumPy ``array`` (or the array a view looks into) was allocated by ump-alloc.
    Anything but a NumPy array raises TypeError, before and after :func:`enable` alike."""
    from . import _numpy

    return _numpy.handles(array)


_hooks.set_switch(enable_auto)  # what UMP_ALLOC=1's import hooks call
