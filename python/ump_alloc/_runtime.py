"""The loaded library's own state: its version and files, the mode and alignment in force, its
error counters, and :func:`trim`."""

from __future__ import annotations

import os

from . import _lib
from ._lib import UmpError, last_error, library_path


def version() -> str:
    """Version of the loaded library."""
    return _lib.lib().ump_version().decode()


def get_include() -> str:
    """The directory holding ``ump_alloc.h``, for C code that calls ump-alloc (like
    ``numpy.get_include()``): ``cc -I$(python -m ump_alloc --include) ...``."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "include"), os.path.join(os.path.dirname(os.path.dirname(here)), "include")):
        if os.path.isfile(os.path.join(d, "ump_alloc.h")):
            return d
    raise UmpError("ump_alloc.h not found: install the package (a built wheel, or pip install . in a checkout)", _lib.ERR_CONFIG)


def get_libdir() -> str:
    """The directory holding the ``libump_alloc.so`` this package loads, for linking C code
    against it: ``cc ... -L$(python -m ump_alloc --libdir) -Wl,-rpath,$(...) -lump_alloc``. Its
    ``lib/pkgconfig`` holds ``ump_alloc.pc`` in an installed package."""
    return os.path.dirname(library_path())


def mode() -> str:
    """The mode in force: a preset ('pinned', 'host', 'system', 'managed', 'registered',
    'device') or 'custom' (sides chosen one by one), or 'unset' before the first allocation.
    :func:`capabilities` says what memory each side has and why.

    Asked without starting the CUDA driver where the sides chosen at start tell (a pinned host
    side that waits for the first use of a GPU is 'pinned'): a process that only uses NumPy
    must not start it (about 0.5 s, and a fork child of a process that started it cannot use
    CUDA). Where only the machine can tell, it is asked."""
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
