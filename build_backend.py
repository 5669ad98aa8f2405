"""The build backend (pyproject.toml's ``build-backend``): setuptools', with one check first.

A wheel holds the Rust library, which cargo builds. Without cargo, a build would fail deep in
pip's output (``[Errno 2] No such file or directory: 'cargo'``) after leaving ``build/`` and an
``.egg-info`` in the source tree; this fails at once instead, with one line that says what to
install, before setuptools writes anything. An sdist needs no cargo. ``UMP_BUILD_LIBRARY``
(a built ``libump_alloc.so``, as ``scripts/wheel.sh`` passes) needs none either.
"""

from __future__ import annotations

import os
import shutil

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403 - every hook setuptools has

NO_CARGO = (
    "ump-alloc: building from source needs Rust's cargo, which was not found (not on PATH, not "
    "in ~/.cargo/bin): install Rust (https://rustup.rs), then run pip again, or install a built "
    "wheel (README: Installing)"
)


def _need_cargo() -> None:
    if os.environ.get("UMP_BUILD_LIBRARY"):
        return
    cargo = os.environ.get("CARGO", "cargo")
    if shutil.which(cargo):
        return
    home = os.path.join(os.path.expanduser("~"), ".cargo", "bin", "cargo")
    if "CARGO" not in os.environ and os.access(home, os.X_OK):
        os.environ["CARGO"] = home  # rustup's place, not on PATH in this shell: setup.py uses it
        return
    raise SystemExit(NO_CARGO)


def _checked(name: str):
    """setuptools' hook ``name``, after the check."""
    hook = getattr(_setuptools, name)

    def run(*args, **kwargs):
        _need_cargo()
        return hook(*args, **kwargs)

    run.__name__ = run.__qualname__ = name
    run.__doc__ = hook.__doc__
    return run


# Every hook that leads to a wheel (PEP 517 and PEP 660); the sdist hooks stay setuptools'.
for _name in (
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_wheel",
    "build_wheel",
    "get_requires_for_build_editable",
    "prepare_metadata_for_build_editable",
    "build_editable",
):
    globals()[_name] = _checked(_name)
del _name
