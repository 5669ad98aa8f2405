"""Loading libump_alloc.so and declaring every C function it exports (argtypes and restype).

The library is loaded once and never unloaded: NumPy arrays remember the handler that made
them and free through it, so the functions must outlive every array.
"""

from __future__ import annotations

import ctypes
import os
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_int,
    c_int32,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)

_HERE = os.path.dirname(os.path.abspath(__file__))

# Status codes (enum ump_status).
OK = 0
ERR_NULL = 1
ERR_INVALID = 2
ERR_NOT_OURS = 3
ERR_OOM = 4
ERR_UNSUPPORTED = 5
ERR_CONFIG = 6
ERR_LOCKED = 7
ERR_CUDA = 8
ERR_INTERNAL = 9

STATUS_NAMES = {
    0: "UMP_OK",
    1: "UMP_ERR_NULL",
    2: "UMP_ERR_INVALID",
    3: "UMP_ERR_NOT_OURS",
    4: "UMP_ERR_OOM",
    5: "UMP_ERR_UNSUPPORTED",
    6: "UMP_ERR_CONFIG",
    7: "UMP_ERR_LOCKED",
    8: "UMP_ERR_CUDA",
    9: "UMP_ERR_INTERNAL",
}

MODE_NAMES = {0: "unset", 1: "host", 2: "system", 3: "managed", 4: "registered", 5: "device", 6: "pinned",
              7: "custom"}
# A side's kind of memory, by name (ump_capabilities.host_side / device_side).
HOST_SIDE_NAMES = {1: "host", 2: "system", 4: "pinned", 3: "managed"}
DEVICE_SIDE_NAMES = {0: "none", 2: "system", 3: "managed", 4: "pinned", 5: "device"}
KIND_NAMES = {
    0: "unknown",
    1: "host",
    2: "system",
    3: "managed",
    4: "registered",
    5: "device",
    6: "foreign-cuda",
    7: "foreign-host",
}

MAX_DEVICES = 16


class DeviceCaps(Structure):
    _fields_ = [
        ("ordinal", c_int32),
        ("pageable_memory_access", c_bool),
        ("uses_host_page_tables", c_bool),
        ("concurrent_managed_access", c_bool),
        ("host_register_supported", c_bool),
        ("host_pointer_for_registered_mem", c_bool),
        ("total_memory", c_uint64),
        ("name", c_char * 96),
    ]


class Capabilities(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("cuda_available", c_bool),
        ("has_prefetch_v2", c_bool),
        ("mode_fixed", c_bool),
        ("driver_version", c_int32),
        ("device_count", c_int32),
        ("mode", c_int),
        ("alignment", c_size_t),
        ("mode_reason", c_char * 256),
        ("devices", DeviceCaps * MAX_DEVICES),
        ("host_side", c_int),
        ("device_side", c_int),
        ("host_reason", c_char * 256),
        ("device_reason", c_char * 256),
        ("fork_shared", c_bool),
        ("fork_rule", c_char * 256),
    ]


class Identity(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("ours", c_bool),
        ("host_accessible", c_bool),
        ("device_accessible", c_bool),
        ("kind", c_int),
        ("device", c_int32),
        ("base", c_size_t),
        ("block_size", c_size_t),
    ]


USAGE_FIELDS = (
    "in_use",
    "in_use_peak",
    "mapped",
    "mapped_peak",
    "cached",
    "allocs",
    "frees",
    "hits",
    "misses",
)


class Usage(Structure):
    _fields_ = [(name, c_uint64) for name in USAGE_FIELDS]

    def as_dict(self) -> dict:
        return {name: int(getattr(self, name)) for name in USAGE_FIELDS}


class PoolStat(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("device", c_int),
        ("fallback", c_bool),
        ("retired", c_bool),
        ("stream", c_void_p),
        ("mapped", c_uint64),
        ("cached", c_uint64),
        ("largest_free", c_uint64),
        ("reserved", c_uint64),
        ("kind", c_int),
    ]


class Stats(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("mode", c_int),
        ("device_count", c_uint32),
        ("total", Usage),
        ("host", Usage),
        ("host_kind", c_int),
        ("device_kind", c_int),
        ("kinds", Usage * 8),
        ("devices", Usage * MAX_DEVICES),
        ("streams", c_uint64),
        ("stream_waits", c_uint64),
        ("stream_syncs", c_uint64),
        ("scopes_open", c_uint64),
        ("errors", c_uint64),
        ("errors_oom", c_uint64),
        ("errors_invalid_free", c_uint64),
        ("errors_double_free", c_uint64),
        ("errors_bad_size", c_uint64),
        ("errors_other", c_uint64),
        ("host_fallback_allocs", c_uint64),
        ("host_fallback_mapped", c_uint64),
        ("pinned", c_uint64),
        ("pinned_cap", c_uint64),
        ("device_reserved", c_uint64 * MAX_DEVICES),
        ("device_largest_free", c_uint64 * MAX_DEVICES),
        ("device_discarded", c_uint64 * MAX_DEVICES),
        ("host_reserved", c_uint64),
        ("host_largest_free", c_uint64),
        ("host_reallocs_in_place", c_uint64),
        ("host_reallocs_copied", c_uint64),
        ("host_realloc_copied_bytes", c_uint64),
        ("host_fork_held", c_uint64),
        ("host_fork_held_blocks", c_uint64),
    ]


SCOPE_KEEP_LIVE = 1


class ScopeReport(Structure):
    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("allocs", c_uint64),
        ("alloc_bytes", c_uint64),
        ("frees", c_uint64),
        ("peak_bytes", c_uint64),
        ("live_blocks", c_uint64),
        ("live_bytes", c_uint64),
        ("freed", c_bool),
    ]


class TransferFacts(Structure):
    """struct ump_transfer_facts"""

    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("direction", c_int32),
        ("memory", c_int32),
        ("resident", c_int32),
        ("coherent", c_int32),
        ("bytes", c_uint64),
        ("touch", ctypes.c_double),
    ]


class TransferPlan(Structure):
    """struct ump_transfer_plan"""

    _fields_ = [
        ("size", c_uint32),
        ("version", c_uint32),
        ("path", c_int32),
        ("view_move", c_int32),
        ("view_possible", c_bool),
        ("reason", c_char * 192),
    ]


# name: (restype, argtypes)
SIGNATURES = {
    "ump_malloc": (c_void_p, [c_size_t]),
    "ump_calloc": (c_void_p, [c_size_t, c_size_t]),
    "ump_realloc": (c_void_p, [c_void_p, c_size_t]),
    "ump_free": (None, [c_void_p, c_size_t]),
    "ump_numpy_handler": (c_void_p, []),
    "ump_numpy_dispatch_handler": (c_void_p, [c_void_p]),
    "ump_numpy_dispatch_set": (c_int, [c_bool]),
    "ump_numpy_dispatching": (c_bool, []),
    "ump_cupy_malloc": (c_void_p, [c_void_p, c_size_t, c_int]),
    "ump_cupy_free": (None, [c_void_p, c_void_p, c_int]),
    "ump_cupy_fast_path_init": (c_int, [c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p]),
    "ump_pool_stat": (c_int, [c_size_t, c_void_p]),
    "ump_torch_malloc": (c_void_p, [c_size_t, c_int, c_void_p]),
    "ump_torch_record_stream": (c_int, [c_void_p, c_void_p]),
    "ump_torch_empty_cache": (c_size_t, []),
    "ump_torch_set_memory_fraction": (c_int, [ctypes.c_double, c_int]),
    "ump_torch_attach": (c_int, [ctypes.c_char_p, ctypes.POINTER(c_int)]),
    "ump_torch_hook_segments": (c_int, [ctypes.c_char_p]),
    "ump_torch_unhook_segments": (c_int, []),
    "ump_torch_segments_hooked": (c_int, []),
    "ump_torch_segments_target": (c_char_p, []),
    "ump_torch_segment_memory": (c_int, [c_char_p]),
    "ump_host_pinned": (c_int, []),
    "ump_mode_known": (c_int, []),
    "ump_pin_host_side": (c_int, [c_int]),
    "ump_device_memory_info": (c_int, [c_int, ctypes.POINTER(c_size_t), ctypes.POINTER(c_size_t)]),
    "ump_torch_free": (None, [c_void_p, c_size_t, c_int, c_void_p]),
    "ump_last_error": (c_char_p, []),
    "ump_clear_error": (None, []),
    "ump_error_count": (c_uint64, []),
    "ump_init": (c_int, []),
    "ump_set_mode": (c_int, [c_char_p]),
    "ump_set_alignment": (c_int, [c_size_t]),
    "ump_set_limit": (c_int, [c_char_p]),
    "ump_config_check": (c_int, []),
    "ump_config_describe": (c_int, [c_char_p, c_char_p, c_char_p, c_size_t]),
    "ump_config_setting": (c_int, [c_char_p, c_char_p, c_size_t]),
    "ump_alignment": (c_size_t, []),
    "ump_block_alignment": (c_size_t, [c_size_t]),
    "ump_current_mode": (c_int, []),
    "ump_version": (c_char_p, []),
    "ump_trim": (c_size_t, []),
    "ump_capabilities": (c_int, [POINTER(Capabilities)]),
    "ump_identify": (c_int, [c_void_p, POINTER(Identity)]),
    "ump_owns": (c_int, [c_void_p]),
    "ump_host_access": (c_int, [c_void_p, c_size_t, c_void_p]),
    "ump_device_access": (c_int, [c_void_p, c_size_t, c_int, c_void_p]),
    "ump_host_access_ex": (c_int, [c_void_p, c_size_t, c_void_p, ctypes.c_double]),
    "ump_device_access_ex": (c_int, [c_void_p, c_size_t, c_int, c_void_p, ctypes.c_double]),
    "ump_plan_transfer": (
        c_int,
        [c_void_p, c_size_t, c_int, c_int, ctypes.c_double, POINTER(TransferFacts), POINTER(TransferPlan)],
    ),
    "ump_decide_transfer": (c_int, [POINTER(TransferFacts), POINTER(TransferPlan)]),
    "ump_config_var": (c_int, [c_size_t, POINTER(c_char_p), POINTER(c_char_p), POINTER(c_char_p)]),
    "ump_stats": (c_int, [POINTER(Stats)]),
    "ump_reset_peak": (c_int, []),
    "ump_scope_begin": (c_int, []),
    "ump_scope_begin_ex": (c_int, [c_uint32]),
    "ump_scope_end": (c_int, []),
    "ump_scope_end_ex": (c_int, [POINTER(ScopeReport)]),
    "ump_scope_keep": (c_int, [c_void_p]),
    "ump_scope_depth": (c_int, []),
    "ump_stream_retire": (c_int, [c_int, c_void_p]),
}


class UmpError(RuntimeError):
    """An error reported by libump_alloc, with its status code (``.status``)."""

    def __init__(self, message: str, status: int = ERR_INTERNAL) -> None:
        super().__init__(message)
        self.status = status
        self.status_name = STATUS_NAMES.get(status, str(status))


def library_path() -> str:
    """Path of the shared library that is (or would be) loaded.

    ``UMP_ALLOC_LIBRARY`` overrides; otherwise the copy installed inside this package; in a
    source checkout without an install, the newest cargo build of the repository.
    """
    env = os.environ.get("UMP_ALLOC_LIBRARY")
    if env:
        if not os.path.exists(env):
            raise UmpError(f"UMP_ALLOC_LIBRARY={env!r} does not exist; {_fix_hint()}", ERR_CONFIG)
        return os.path.abspath(env)
    packaged = os.path.join(_HERE, "libump_alloc.so")
    if os.path.exists(packaged):
        return packaged
    repo = os.path.dirname(os.path.dirname(_HERE))
    builds = [
        os.path.join(repo, "target", profile, "libump_alloc.so") for profile in ("release", "debug")
    ]
    builds = [b for b in builds if os.path.exists(b)]
    if builds:
        return max(builds, key=os.path.getmtime)
    raise UmpError(
        "libump_alloc.so not found: install the package (pip install .) or set UMP_ALLOC_LIBRARY",
        ERR_CONFIG,
    )


_LIB = None


def _which_library(path: str) -> str:
    """How to name ``path`` in a message: the variable that chose it, or the path."""
    if os.environ.get("UMP_ALLOC_LIBRARY"):
        return f"UMP_ALLOC_LIBRARY={path!r}"
    return path


def _fix_hint() -> str:
    """What to do about a library that cannot be used, by where it came from."""
    if os.environ.get("UMP_ALLOC_LIBRARY"):
        return ("point UMP_ALLOC_LIBRARY at the libump_alloc.so built with this package "
                "(target/release/libump_alloc.so in a checkout), or unset it to load the packaged one")
    return ("reinstall ump-alloc: the library next to this Python package does not belong to it "
            "(pip install --force-reinstall --no-deps . in a checkout, or the wheel it came from)")


def lib() -> ctypes.CDLL:
    """The loaded library, with every signature declared. Loaded once, never unloaded.

    A file that cannot be loaded, or a library that lacks a function this package declares
    (another library, or a libump_alloc of another version), raises :class:`UmpError`
    (``UMP_ERR_CONFIG``) naming the file and the fix; nothing is loaded then."""
    global _LIB
    if _LIB is None:
        path = library_path()
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            raise UmpError(f"{_which_library(path)} cannot be loaded ({e}); {_fix_hint()}", ERR_CONFIG) from None
        missing = [name for name in SIGNATURES if not hasattr(handle, name)]
        if missing:
            if len(missing) == len(SIGNATURES):
                what = f"is not libump_alloc: it exports none of its functions (no {missing[0]})"
            else:
                try:
                    handle.ump_version.restype = c_char_p
                    version = f" {handle.ump_version().decode()}"
                except (AttributeError, UnicodeDecodeError):
                    version = ""
                more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
                what = (f"is a libump_alloc{version} this package cannot use: it lacks {missing[0]}{more} "
                        "(a library of another version)")
            raise UmpError(f"{_which_library(path)} {what}; {_fix_hint()}", ERR_CONFIG)
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(handle, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _LIB = handle
    return _LIB


def last_error() -> str | None:
    """This thread's last error message from the library, or None."""
    msg = lib().ump_last_error()
    return msg.decode("utf-8", "replace") if msg is not None else None


def check(status: int, what: str) -> None:
    """Raise UmpError with the library's message unless ``status`` is UMP_OK."""
    if status != OK:
        raise UmpError(last_error() or f"{what} failed with {STATUS_NAMES.get(status, status)}", status)
