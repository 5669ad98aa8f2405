"""Zero-copy helpers on the CPU side: argument handling, host_access on host memory, and the
is_zero_copy relation. The GPU behaviour is in test_gpu.py / gpu_checks.py."""

import numpy as np
import pytest

import ump_alloc
from conftest import GPU


def test_is_zero_copy_relation():
    a = np.arange(100, dtype=np.float64)
    assert ump_alloc.is_zero_copy(a, a[10:20])
    assert ump_alloc.is_zero_copy(a[::-1], a[50:51])
    assert not ump_alloc.is_zero_copy(a, a.copy())
    assert not ump_alloc.is_zero_copy(a[:10], a[10:20])
    assert not ump_alloc.is_zero_copy(a[:0], a)
    with pytest.raises(TypeError):
        ump_alloc.is_zero_copy(a, [1, 2])


def test_host_access_on_host_memory(ump):
    a = np.random.default_rng(3).random(100_000)
    ump_alloc.host_access(a)  # no GPU: validates and returns
    ump_alloc.host_access(a[10:], 8 * 5)
    with pytest.raises(ump_alloc.UmpError) as e:
        ump_alloc.host_access(a.ctypes.data, a.nbytes * 1000)
    assert "past the end" in str(e.value)
    with pytest.raises(ump_alloc.UmpError) as e:
        ump_alloc.host_access(0, 16)
    assert e.value.status_name == "UMP_ERR_NULL"


def test_asnumpy_rejects_non_gpu_arrays():
    a = np.arange(3)
    assert ump_alloc.asnumpy(a) is a, "a NumPy array passes through, as cupy.asnumpy does"
    with pytest.raises(TypeError):
        ump_alloc.asnumpy([1, 2, 3])
    with pytest.raises(ValueError):
        ump_alloc.asarray(np.arange(3), like="jax")


@pytest.mark.skipif(GPU, reason="checks the CPU-only behaviour")
def test_device_access_without_gpu(ump):
    a = np.ones(10)
    with pytest.raises(ump_alloc.UmpError) as e:
        ump_alloc.device_access(a)
    assert e.value.status_name == "UMP_ERR_UNSUPPORTED"
