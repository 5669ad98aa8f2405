"""Post-import hooks: run a function right after a module finishes importing.

``UMP_ALLOC=1`` must switch NumPy, CuPy and PyTorch over at interpreter start without importing
any of them (importing torch costs seconds). Each library is hooked the moment the program
imports it, which for PyTorch is also the last moment a pluggable allocator can be installed:
before the first CUDA tensor.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from typing import Callable

_lock = threading.RLock()
_hooks: dict[str, list[Callable]] = {}
_finder = None


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self._inner = inner
        self._name = name

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _fire(self._name, module)

    def __getattr__(self, attr):
        return getattr(self._inner, attr)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self):
        self._busy = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _Loader(spec.loader, fullname)
        return spec


def _fire(name, module):
    with _lock:
        hooks = _hooks.pop(name, [])
    for hook in hooks:
        hook(module)


def when_imported(name: str, hook: Callable) -> None:
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
