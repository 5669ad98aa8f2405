"""Shared by the Python benchmarks: skip cleanly where the machine cannot run them."""

from __future__ import annotations

import importlib
import sys


def modules_or_skip(*modules: str) -> None:
    """Exit 0 with one line ``skipped: ...`` unless ``modules`` can be imported."""
    for m in modules:
        try:
            importlib.import_module(m)
        except Exception as e:  # noqa: BLE001 - any import failure means: cannot run here
            print(f"skipped: needs {m} ({type(e).__name__}: {e})")
            sys.exit(0)


def gpu_or_skip(*modules: str) -> None:
    """Exit 0 with one line ``skipped: ...`` unless a CUDA GPU and ``modules`` are present."""
    modules_or_skip(*modules)
    import ump_alloc

    caps = ump_alloc.capabilities()
    if not caps["cuda_available"] or not caps["device_count"]:
        print("skipped: no CUDA GPU on this machine (the benchmark measures GPU memory)")
        sys.exit(0)


def torch_route() -> str | None:
    """ump-alloc's route for PyTorch (``segments``, ``swap``, ``native`` after a fall-back), or
    None where ump-alloc does not serve PyTorch: read from the public
    ``ump_alloc.memory_summary()``, whose line ``PyTorch: ROUTE route: why`` says it."""
    import ump_alloc

    for line in ump_alloc.memory_summary().splitlines():
        if line.startswith("PyTorch: ") and " route: " in line:
            return line[len("PyTorch: ") :].split(" route: ", 1)[0]
    return None


def label_or_skip(doc: str, *modules: str) -> str:
    """The ``LABEL`` argument of a probe that is run once plain and once under ``UMP_ALLOC=1``
    and prints it first on its result line (``doc``: the probe's docstring, for ``--help``);
    then :func:`gpu_or_skip` with ``modules``."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("label", help="printed first on the result line")
    label = ap.parse_args().label
    gpu_or_skip(*modules)
    return label


def ump_env(settings: dict) -> dict:
    """This process's environment without its ``UMP_ALLOC*`` settings (``UMP_ALLOC_LIBRARY``
    kept), plus ``settings``: the environment of one configuration's fresh interpreter."""
    import os

    env = {k: v for k, v in os.environ.items() if not (k.startswith("UMP_ALLOC") and k != "UMP_ALLOC_LIBRARY")}
    env.update(settings)
    return env


def run_under_ump() -> None:
    """Unless this process already runs under ``UMP_ALLOC=1``: run the calling script again, with
    its arguments, in a fresh interpreter switched on from the start (``UMP_ALLOC=1``, the
    other ``UMP_ALLOC*`` settings dropped as in :func:`ump_env`), and exit with its status."""
    import os
    import subprocess

    if os.environ.get("UMP_ALLOC") == "1":
        return
    script = os.path.abspath(sys.argv[0])
    sys.exit(subprocess.run([sys.executable, script, *sys.argv[1:]], env=ump_env({"UMP_ALLOC": "1"})).returncode)


def libc_memory():
    """The C library through ctypes, with ``mmap``, ``munmap`` and ``madvise`` typed for
    addresses and sizes (``mmap`` returns an int, or ``MAP_FAILED``: ``ctypes.c_void_p(-1).value``)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc
