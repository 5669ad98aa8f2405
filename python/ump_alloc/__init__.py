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

from ._config import config_errors, config_table, unknown_variables
from ._enable import disable, enable, enabled, handles, is_enabled
from ._lib import UmpError, last_error, library_path
from ._runtime import alignment, block_alignment, clear_error, error_count, get_include, get_libdir, mode, trim, version

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing at start-up
if TYPE_CHECKING:
    # Loaded on first use by __getattr__ below; declared here for type checkers and IDEs.
    # _LAZY names the same ones, with their modules.
    from ._access import device_access, host_access
    from ._identity import Identity, capabilities, identify
    from ._stats import ScopeReport, reset_peak, scope, stats
    from ._summary import memory_summary, pool_stats
    from ._transfer import TransferPlan, decide_transfer
    from ._zerocopy import ZeroCopyBuffer, asarray, asnumpy, is_zero_copy, transfer_plan

    __version__: str

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


# What ``import ump_alloc`` loads on first use: the switch (enable and the configuration) is
# all that UMP_ALLOC=1's hook needs at NumPy's import, so that start-up stays short (these
# modules took about 10 ms there, measured on the CPU box); the zero-copy functions import
# NumPy, which ``import ump_alloc`` alone must not.
_LAZY = {
    **dict.fromkeys(("device_access", "host_access"), "_access"),
    **dict.fromkeys(("Identity", "capabilities", "identify"), "_identity"),
    **dict.fromkeys(("ScopeReport", "reset_peak", "scope", "stats"), "_stats"),
    **dict.fromkeys(("memory_summary", "pool_stats"), "_summary"),
    **dict.fromkeys(("TransferPlan", "decide_transfer"), "_transfer"),
    **dict.fromkeys(("ZeroCopyBuffer", "asarray", "asnumpy", "is_zero_copy", "transfer_plan"), "_zerocopy"),
}

if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name is an error there

    def __getattr__(name: str) -> object:
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
        if name in _LAZY:
            import importlib

            value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
            globals()[name] = value  # found directly from now on
            return value
        raise AttributeError(f"module 'ump_alloc' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


del annotations, TYPE_CHECKING  # keep the namespace to the public API
