"""ump-alloc's start-up hook (``ump_alloc.pth`` calls :func:`autoload` when ``UMP_ALLOC`` is set)
and post-import hooks: run a function right after a module finishes importing.

A top-level module on purpose: importing ``ump_alloc`` imports ctypes, dataclasses and the
package's modules, and ``UMP_ALLOC=1`` must import nothing at interpreter start (every Python
command would pay for it, ``pip --version`` included). Each library is hooked the moment the
program imports it, which for PyTorch is also the last moment a pluggable allocator can be
installed: before the first CUDA tensor. A configuration error then raises from that import
statement, so the program stops there with the message, never runs on another allocator than
the one asked for.

The package uses this module (its post-import hooks are these); this module knows the package
only by the name ``ump_alloc.pth`` gives :func:`autoload`, and calls what the package hands
over as it loads (:func:`set_switch`), so the two do not import each other.
"""

from __future__ import annotations

import sys
from _thread import RLock  # not threading: nothing more than this at interpreter start

_lock = RLock()
_hooks: dict = {}  # module name -> [hook(module)]
_finder = None
_autoloaded = False


class _Loader:
    def __init__(self, inner, name):
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        if self._name == "numpy" and _autoloaded:
            _register_membarrier()
        self._inner.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class _Finder:
    """A meta path finder (duck-typed: importing importlib.abc costs start-up time)."""

    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks or fullname in self._busy:
            return None
        import importlib.util

        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec

    def invalidate_caches(self):
        pass


def _fire(name, module):
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook) -> None:
    """Call ``hook(module)`` now if ``name`` is imported, else right after its import."""
    global _finder
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
            if _finder is None:
                _finder = _Finder()
                sys.meta_path.insert(0, _finder)
            return
    hook(module)


def cancel(name: str) -> None:
    """Forget pending hooks for ``name``."""
    with _lock:
        _hooks.pop(name, None)


_package = None  # the package autoload() loads when a library it switches is imported
_switch = None  # what switches a library over: the package's, handed over by set_switch


# membarrier(2)'s number per machine, and its commands.
_SYS_MEMBARRIER = {"x86_64": 324, "aarch64": 283, "riscv64": 283, "ppc64le": 365, "s390x": 356}
_MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED = 1 << 4
#: What registering for membarrier before NumPy's import answered (None: not tried), and the
#: threads the process had then.
membarrier_registered = None
membarrier_threads = None


def _register_membarrier() -> None:
    """Register this process for ``membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)``, which the
    library's per-thread caches use, while the process has one thread: NumPy's import starts
    OpenBLAS's threads, and with several threads the kernel's registration waits for an RCU
    grace period (``synchronize_rcu``), 5-24 ms at the first allocation on the 2-core CPU box.
    Registered here, the library's own registration returns at once. Advisory: any failure
    leaves the library to register (or to fall back to fences) as before."""
    global membarrier_registered, membarrier_threads
    if membarrier_registered is not None or not sys.platform.startswith("linux"):
        return
    import os

    # The kernel's machine names the 64-bit tables: a 32-bit interpreter on it (another
    # table, where 324 is fallocate) asks nothing.
    nr = _SYS_MEMBARRIER.get(os.uname().machine) if sys.maxsize > 2**32 else None
    if nr is None:
        membarrier_registered = False
        return
    try:
        import ctypes  # the package imports it at NumPy's import anyway

        rc = ctypes.CDLL(None).syscall(nr, _MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0)
    except (OSError, AttributeError):
        rc = -1
    membarrier_registered = rc == 0
    try:
        membarrier_threads = len(os.listdir("/proc/self/task"))
    except OSError:
        pass


def set_switch(switch) -> None:
    """Called by ``ump_alloc`` as it loads: the function :func:`autoload`'s hooks call, with
    ``numpy=True``, ``cupy=None`` or ``torch=None``, as each library is imported."""
    global _switch
    _switch = switch


def _enable(**libs) -> None:
    if _switch is None:
        __import__(_package)  # as it loads, the package hands its switch over (set_switch)
    _switch(**libs)


def autoload(package: str) -> None:
    """Hook NumPy, CuPy and PyTorch: right after each one's import, ``package`` (``ump_alloc``,
    named by ``ump_alloc.pth``) is loaded and its switch (:func:`set_switch`) switches it over.
    Any value of ``UMP_ALLOC`` but empty and ``0`` gets here; the value itself is checked with
    the rest of the configuration at the first of those imports. Idempotent: site may process
    the ``.pth`` file once per path that leads to site-packages (a venv's ``lib64`` link)."""
    global _autoloaded, _package
    with _lock:
        if _autoloaded:
            return
        _autoloaded = True
        _package = package
    when_imported("numpy", lambda _m: _enable(numpy=True))
    when_imported("cupy", lambda _m: _enable(cupy=None))
    when_imported("torch", lambda _m: _enable(torch=None))
