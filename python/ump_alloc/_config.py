"""The ``UMP_ALLOC_*`` configuration as the library's table has it (``ump_config_var``,
``ump_config_describe``, ``ump_config_check``, ``ump_config_setting``): :func:`setting`, the
one reading of a variable for the whole package, :func:`config_table`, :func:`config_errors`,
the variables it does not know (a warning at start-up, with the closest name), and
:func:`init`, which starts the library."""

from __future__ import annotations

import ctypes
import os
import warnings

from . import _lib
from ._lib import last_error
from ._runtime import clear_error


def init() -> None:
    """Warn once about unknown ``UMP_ALLOC*`` variables, then ``ump_init`` (the configuration
    is read and fixed; a bad one raises :class:`UmpError`)."""
    _warn_unknown_vars()
    _lib.check(_lib.lib().ump_init(), "ump_init")


def setting(name: str) -> str:
    """The value of the ``UMP_ALLOC_*`` variable ``name`` in the environment now, read through
    the library's configuration table (``ump_config_setting``): as typed (trimmed), or the
    table's default where it is unset or empty. Every variable the package acts on is read
    here, so that Python and the library agree on what a value means.

    Raises :class:`UmpError` (status ``UMP_ERR_CONFIG``) with the table's own message for a
    value it refuses, the text the first allocation would give."""
    buf = ctypes.create_string_buffer(4096)
    rc = _lib.lib().ump_config_setting(name.encode(), buf, len(buf))
    if rc != _lib.OK:
        msg = (last_error() or f"{name}: not readable").removeprefix("ump_config_setting: ")
        clear_error()
        if rc == _lib.ERR_CONFIG:
            msg += f" (set {name} to one of those, or unset it; python -m ump_alloc info lists every variable)"
        raise _lib.UmpError(msg, rc)
    return buf.value.decode(errors="replace")


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it."""
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


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
    try:
        numpy_route = setting("UMP_ALLOC_NUMPY_ROUTE")
    except _lib.UmpError:
        numpy_route = None  # a value the table refuses: the configuration error above says so
    if numpy_route == "numpy_allocator" and not installed("numpy_allocator"):
        out.append("configuration error: UMP_ALLOC_NUMPY_ROUTE=numpy_allocator, but numpy_allocator is not "
                   "installed: pip install numpy_allocator, or unset UMP_ALLOC_NUMPY_ROUTE")
    out += [_unknown_message(n, near) for n, near in unknown_variables()]
    return out


def unknown_variables() -> list[tuple[str, str | None]]:
    """``UMP_ALLOC*`` variables in the environment that ump-alloc does not read, each with the
    closest known name (or None)."""
    known = {row["name"] for row in _config_rows()}
    out = []
    for name in sorted(os.environ):
        if name.startswith("UMP_ALLOC") and name not in known:
            import difflib  # only for a misspelt name: an import on every start-up otherwise

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
        warnings.warn(_unknown_message(name, near), RuntimeWarning, stacklevel=_user_stacklevel())


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning issued by the caller of this function point at
    the first frame outside ump-alloc, its import hook, the import machinery and contextlib:
    the program's ``enable()`` call, or under ``UMP_ALLOC=1`` the statement that imported
    NumPy (or CuPy, PyTorch)."""
    import sys

    here = os.path.dirname(os.path.abspath(__file__)) + os.sep
    skip = ("importlib", "_ump_alloc_hooks.py", "contextlib.py")
    frame = sys._getframe(2)  # the caller of the function that warns: stacklevel 2
    level = 2
    while frame is not None:
        name = frame.f_code.co_filename
        # warnings.warn does not count the import system's own frames (importlib._bootstrap).
        if not ("importlib" in name and "_bootstrap" in name):
            if not (os.path.abspath(name).startswith(here) or any(k in name for k in skip)):
                return level
            level += 1
        frame = frame.f_back
    return 2


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
        name, default, help_ = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_char_p()
        if L.ump_config_var(i, ctypes.byref(name), ctypes.byref(default), ctypes.byref(help_)) != _lib.OK:
            break
        n = name.value.decode()
        rows.append({"name": n, "default": default.value.decode(), "help": help_.value.decode(), "value": os.environ.get(n)})
        i += 1
    L.ump_clear_error()  # the row past the end is reported as an error
    return rows


def _describe(name: str, value: str) -> str | None:
    """``ump_config_describe``: what ``value`` means for variable ``name``, or None if invalid."""
    buf = ctypes.create_string_buffer(256)
    if _lib.lib().ump_config_describe(name.encode(), value.encode(), buf, len(buf)) != _lib.OK:
        clear_error()
        return None
    return buf.value.decode(errors="replace")
