import ctypes
import os
import shutil
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


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only every N-th test, starting at the I-th (0-based): the GPU suite in "
                          "parts, each under the device tool's ten-minute limit per call")


def _shard(config, items):
    spec = config.getoption("--shard")
    if not spec:
        return
    try:
        i, n = (int(x) for x in spec.split("/"))
        if not 0 <= i < n:
            raise ValueError
    except ValueError:
        raise pytest.UsageError(f"--shard {spec!r}: give I/N with 0 <= I < N, e.g. --shard 0/2") from None
    keep = [item for k, item in enumerate(items) if k % n == i]
    config.hook.pytest_deselected(items=[item for k, item in enumerate(items) if k % n != i])
    items[:] = keep


def pytest_collection_modifyitems(config, items):
    _shard(config, items)
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


def run_check(module, name, env):
    """Run ``module.name()`` (a module of checks beside this file) in a fresh interpreter with
    ``env``; it must exit 0 and print PASS itself (a check prints PASS at each place it ends
    well, so one that returns or exits early by mistake fails). Prints the end of its output;
    returns the result."""
    here = os.path.dirname(os.path.abspath(__file__))
    r = run_python(f"import sys; sys.path.insert(0, {here!r}); import {module} as t; t.{name}()",
                   env=env, check=False)
    print(r.stdout[-4000:])
    print(r.stderr[-6000:], file=sys.stderr)
    assert r.returncode == 0 and "PASS" in r.stdout, f"{name} {env} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def build_stand_in_cuda(tmp_path_factory, source, *flags):
    """A folder holding ``libcuda.so.1`` compiled from C ``source`` (with ``flags``): a stand-in
    CUDA driver for machines without one. Skips the test where there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("stand_in_cuda")
    src = d / "stand_in_cuda.c"
    src.write_text(source)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libcuda.so.1"), str(src), *flags], check=True)
    return str(d)


def stand_in_env(folder, **settings):
    """Settings for a fresh interpreter that loads the stand-in driver of ``folder`` and keeps
    NumPy's BLAS to one thread (its own pool is not what the stand-in tests look at)."""
    env = {"LD_LIBRARY_PATH": folder + os.pathsep + os.environ.get("LD_LIBRARY_PATH", ""),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.update(settings)
    return env


def rand_bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
