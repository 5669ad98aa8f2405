"""GPU checks, each run in a fresh interpreter by test_gpu.py: ``python gpu_checks.py NAME``
with UMP_ALLOC_MODE (and friends) in the environment. Random data throughout, outputs poisoned
before kernels write them. Prints ``PASS NAME`` on success."""

import ctypes
import os
import sys

import numpy as np


def _mode():
    return os.environ.get("UMP_ALLOC_MODE", "auto")


def _cupy_view(a):
    """A CuPy array over NumPy array `a`'s own memory (no copy)."""
    import cupy as cp

    mem = cp.cuda.UnownedMemory(a.ctypes.data, a.nbytes, a, device_id=0)
    return cp.ndarray(a.shape, a.dtype, cp.cuda.MemoryPointer(mem, 0), strides=a.strides)


def numpy_shared_with_cupy_and_torch():
    """NumPy arrays from ump memory read and written in place by CuPy kernels and torch ops."""
    import cupy as cp
    import torch

    import ump_alloc

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(11)
    for n in [1, 1000, 3_000_001, 64 * 2**20 // 4]:
        x = rng.standard_normal(n).astype(np.float32)
        ident = ump_alloc.identify(x)
        assert ident.ours and ident.device_accessible, ident
        expect = x * 3 + 1
        gx = _cupy_view(x)
        assert gx.data.ptr == x.ctypes.data
        cp.ElementwiseKernel("", "float32 y", "y = y * 3 + 1", "ump_t1")(gx)
        cp.cuda.get_current_stream().synchronize()
        # The kernel's writes, seen by the host (the GPU fuses y*3+1 into one FMA: 1 ulp).
        np.testing.assert_allclose(x, expect, rtol=1e-6, atol=1e-6)
        assert not np.array_equal(x, expect / 3)
        # Host writes, then a CuPy reduction reads them.
        x[:] = rng.standard_normal(n).astype(np.float32)
        total = float(cp.sum(gx, dtype=cp.float64).get())
        assert abs(total - float(x.sum(dtype=np.float64))) <= 1e-3 * max(1.0, abs(total)) + 1e-2
        # torch op in place on the same memory, through __cuda_array_interface__.
        t = torch.as_tensor(gx, device="cuda")
        assert t.data_ptr() == x.ctypes.data
        before = x.copy()
        t.mul_(-2).add_(5)
        torch.cuda.synchronize()
        np.testing.assert_allclose(x, before * -2 + 5, rtol=1e-6)
    # Output poisoned, written by a kernel reading another ump array.
    a = rng.standard_normal(1_000_000).astype(np.float32)
    out = np.full_like(a, np.nan)
    cp.multiply(_cupy_view(a), 2, out=_cupy_view(out))
    cp.cuda.get_current_stream().synchronize()
    assert not np.isnan(out).any()
    np.testing.assert_array_equal(out, a * 2)


def cupy_arrays_are_host_readable():
    """CuPy arrays allocated by ump-alloc viewed from NumPy with no copy."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    cp.random.seed(5)
    g = cp.random.standard_normal(2_000_003, dtype=cp.float32)
    ident = ump_alloc.identify(g)
    assert ident.ours and ident.device == 0 and ident.kind == _expect_kind(), ident
    cp.cuda.get_current_stream().synchronize()
    buf = (ctypes.c_float * g.size).from_address(g.data.ptr)
    h = np.ctypeslib.as_array(buf)
    np.testing.assert_array_equal(h, cp.asnumpy(g))
    h[:10] = 42
    assert float(g[:10].sum().get()) == 420.0


def _expect_kind():
    return {"managed": "managed", "registered": "registered", "device": "device", "system": "system"}.get(_mode(), "managed")


def cupy_workload_matches_default():
    """A CuPy workload on ump-alloc gives the same results as on CuPy's default pool."""
    import cupy as cp

    import ump_alloc

    def work():
        cp.random.seed(1234)
        a = cp.random.standard_normal((512, 384), dtype=cp.float32)
        b = cp.random.standard_normal((384, 256), dtype=cp.float32)
        c = a @ b
        f = cp.fft.rfft(c, axis=1)
        s = cp.sort(c.ravel())
        r = [c.sum(), cp.abs(f).mean(), s[::1000], cp.cumsum(c, axis=0)[-1], cp.linalg.norm(c)]
        chunks = [cp.full(int(n), float(i), dtype=cp.float64) for i, n in enumerate(cp.random.randint(1, 100_000, 50).get())]
        r.append(cp.concatenate(chunks).sum())
        return [cp.asnumpy(x) for x in r]

    ref = work()
    ump_alloc.enable(torch=False)
    got = work()
    g = cp.empty(100, cp.float32)
    assert ump_alloc.identify(g).ours, "CuPy does not allocate from ump-alloc"
    for x, y in zip(ref, got):
        np.testing.assert_array_equal(x, y)


def torch_workload_on_ump():
    """A small training loop on ump-alloc; results match the CPU within tolerance; tensors are ours."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True)
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model_gpu = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model_gpu.load_state_dict(model_cpu.state_dict())
    model_gpu = model_gpu.cuda()
    assert ump_alloc.identify(next(model_gpu.parameters())).ours, "torch does not allocate from ump-alloc"
    opt_c = torch.optim.SGD(model_cpu.parameters(), lr=0.05)
    opt_g = torch.optim.SGD(model_gpu.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        x = torch.randn(256, 64, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)
        for model, opt, dev in ((model_cpu, opt_c, "cpu"), (model_gpu, opt_g, "cuda")):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(dev)), y.to(dev))
            loss.backward()
            opt.step()
    for pc, pg in zip(model_cpu.parameters(), model_gpu.parameters()):
        torch.testing.assert_close(pc, pg.cpu(), rtol=1e-3, atol=1e-4)
    big = torch.empty(50_000_000, device="cuda").uniform_()
    assert ump_alloc.identify(big).ours
    assert 0.49 < float(big.mean()) < 0.51


def device_argument():
    """Memory is made for the device asked for; a device that does not exist gets NULL + message."""
    from ump_alloc import _lib

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    L = _lib.lib()
    n = int(os.environ.get("UMP_GPU_COUNT", "1"))
    for dev in range(n):
        p = L.ump_cupy_malloc(None, 1 << 20, dev)
        q = L.ump_torch_malloc(3000, dev, None)
        assert p and q
        for ptr in (p, q):
            ident = ump_alloc.identify(ptr)
            assert ident.ours and ident.device == dev, ident
        L.ump_cupy_free(None, p, dev)
        L.ump_torch_free(q, 3000, dev, None)
    before = L.ump_error_count()
    assert not L.ump_cupy_malloc(None, 100, n + 7)
    assert f"no CUDA device {n + 7}" in ump_alloc.last_error()
    assert not L.ump_torch_malloc(100, -3, None)
    assert L.ump_error_count() == before + 2


def out_of_memory():
    """With UMP_ALLOC_LIMIT, CuPy raises OutOfMemoryError, torch's entry returns NULL; nothing aborts."""
    import cupy as cp

    from ump_alloc import _lib

    import ump_alloc

    ump_alloc.enable(torch=False)
    limit = 256 << 20
    with_limit = os.environ.get("UMP_ALLOC_LIMIT")
    assert with_limit, "run with UMP_ALLOC_LIMIT"
    keep = cp.ones(10_000, cp.float32)
    try:
        cp.empty(2 * limit, cp.uint8)
    except cp.cuda.memory.OutOfMemoryError as e:
        assert "UMP_ALLOC_LIMIT" in str(e), str(e)
    else:
        raise AssertionError("no OutOfMemoryError")
    L = _lib.lib()
    assert not L.ump_torch_malloc(2 * limit, 0, None)
    assert "UMP_ALLOC_LIMIT" in ump_alloc.last_error()
    # Still healthy afterwards.
    assert float(keep.sum().get()) == 10_000.0
    x = cp.arange(1000, dtype=cp.float32)
    assert float(x.sum().get()) == 499500.0


def torch_null_probe():
    """Record what torch does when the pluggable allocator returns NULL (no assertion)."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True)
    try:
        t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
        print(f"torch.empty over the limit returned a tensor with data_ptr={t.data_ptr():#x}")
    except Exception as e:  # noqa: BLE001
        print(f"torch.empty over the limit raised {type(e).__name__}: {e}")


def system_mode_refused():
    import ump_alloc

    try:
        ump_alloc.enable()
    except ump_alloc.UmpError as e:
        msg = str(e)
        assert "pageable memory access" in msg and "UMP_ALLOC_MODE=managed" in msg, msg
        print("refused:", msg)
    else:
        raise AssertionError("mode system was accepted on a GPU without HMM")


def auto_mode():
    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    c = ump_alloc.capabilities()
    print("auto ->", ump_alloc.mode(), "|", c["mode_reason"])
    d = c["devices"][0]
    expect = "system" if d["pageable_memory_access"] else "managed" if d["concurrent_managed_access"] else "registered"
    assert ump_alloc.mode() == expect


def managed_fresh_reads_zero():
    """Probe (printed, not asserted): does fresh managed memory read as zero?"""
    from ump_alloc import _lib

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    L = _lib.lib()
    p = L.ump_malloc(64 << 20)
    a = np.ctypeslib.as_array((ctypes.c_uint8 * (64 << 20)).from_address(p))
    print("fresh managed block all zero:", not a.any())
    L.ump_free(p, 0)


if __name__ == "__main__":
    name = sys.argv[1]
    globals()[name]()
    print("PASS", name)
