import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

import ump_alloc
from ump_alloc import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _gpu_available():
    try:
        return ump_alloc.capabilities()["cuda_available"]
    except Exception:
        return False


GPU = _gpu_available()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def lib():
    return _lib.lib()


@pytest.fixture
def ump():
    """NumPy on ump-alloc inside the test, restored afterwards."""
    with ump_alloc.enabled(cupy=False, torch=False):
        yield ump_alloc


def run_python(code, env=None, check=True):
    """Run `code` in a fresh interpreter (the configuration is read once per process)."""
    e = dict(os.environ)
    for k in list(e):
        if k.startswith("UMP_ALLOC") and k != "UMP_ALLOC_LIBRARY":
            del e[k]
    e.update(env or {})
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}")
    return r


def rand_bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
