"""GPU checks, each run in a fresh interpreter by test_gpu.py: ``python gpu_checks.py NAME``
with UMP_ALLOC_MODE (and friends) in the environment. Random data throughout, outputs poisoned
before kernels write them. Prints ``PASS NAME`` on success."""

import ctypes
import os
import sys
import time

import numpy as np


def _mode():
    return os.environ.get("UMP_ALLOC_MODE", "auto")


def _first_gpu_use():
    """The process's first use of a GPU through ump-alloc (a device-side allocation): with the
    default UMP_ALLOC_PIN=lazy, NumPy's memory is pinned from here on (issue 33)."""
    from ump_alloc import _lib

    L = _lib.lib()
    p = L.ump_cupy_malloc(None, 1 << 20, 0)
    assert p, _lib.last_error()
    L.ump_cupy_free(None, p, 0)


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
    early = rng.standard_normal(3_000_001).astype(np.float32)  # made before any GPU use
    lazy = ump_alloc.capabilities()["host_side"] == "pinned"
    assert ump_alloc.identify(early).device_accessible != lazy, ump_alloc.identify(early)
    cp.zeros(1)  # the first use of the GPU (through ump-alloc's CuPy allocator) pins it
    assert ump_alloc.identify(early).device_accessible, ump_alloc.identify(early)
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
    """The kind of memory CuPy and PyTorch get in the mode under test (the device side)."""
    return {"managed": "managed", "registered": "registered", "device": "device", "system": "system",
            "pinned": "managed"}.get(_mode(), "managed")


def _expect_host_kind():
    """The kind of memory NumPy gets in the mode under test (the host side)."""
    return {"managed": "managed", "registered": "registered", "device": "host", "system": "system",
            "pinned": "registered"}.get(_mode(), "registered")


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


def torch_out_of_memory():
    """Over UMP_ALLOC_LIMIT, PyTorch raises torch.OutOfMemoryError with ump-alloc's message (never
    a tensor at address 0), memory cached on other streams is given back first, and PyTorch
    stays usable."""
    import torch

    import ump_alloc
    from ump_alloc import _torch

    ump_alloc.enable(cupy=False, torch=True)
    assert _torch.attached(), "ump_torch_attach failed"
    limit = 256 << 20
    keep = torch.arange(1000, device="cuda", dtype=torch.float32)
    for nbytes in (1 << 30, 2 * limit):
        try:
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError as e:
            assert "UMP_ALLOC_LIMIT" in str(e) and "ump-alloc" in str(e), str(e)
        else:
            raise AssertionError(f"no OutOfMemoryError; got a tensor at {t.data_ptr():#x}")
    # 150 MiB cached on a side stream's pool: the default stream's 150 MiB fits only once it
    # is given back (or adopted), under a 256 MiB limit.
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.empty(150 << 20, dtype=torch.uint8, device="cuda")
        a.fill_(3)
    side.synchronize()
    del a
    b = torch.full((150 << 20,), 5, dtype=torch.uint8, device="cuda")
    assert int(b[:1000].sum()) == 5000
    del b
    assert float(keep.sum()) == 499500.0
    x = torch.randn(1000, device="cuda")
    assert abs(float(x.cpu().sum()) - float(x.sum())) < 1e-2


def _record_stream_trials(record, trials=10):
    """The issue-11 scenario: x is filled on the default stream and read on a side stream behind
    a 30 ms kernel; x.record_stream(side) (or not), del x; a new tensor of the same size on the
    default stream is written at once. Returns (wrong sums, reuses of x's block)."""
    import torch

    side = torch.cuda.Stream()
    n = 16 << 20  # 64 MiB of int32
    gen = torch.Generator(device="cpu").manual_seed(11)
    wrong = reused = 0
    for _ in range(trials):
        host = torch.randint(1, 1 << 20, (n,), generator=gen, dtype=torch.int32)
        expected = int(host.sum(dtype=torch.int64))
        x = host.cuda()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.cuda._sleep(int(30e-3 * 1.5e9))
            total = x.sum(dtype=torch.int64)
        if record:
            x.record_stream(side)
        ptr = x.data_ptr()
        del x
        y = torch.full((n,), -7, dtype=torch.int32, device="cuda")  # the poison
        reused += y.data_ptr() == ptr
        side.synchronize()
        wrong += int(total.item()) != expected
        del y, total
        torch.cuda.synchronize()
    return wrong, reused


def torch_record_stream():
    """tensor.record_stream(side) keeps the block from reuse until the side stream's work is done.
    The control (the same program without record_stream, i.e. the hook ignored) must show the
    corruption, so the check can fail."""
    import torch

    import ump_alloc
    from ump_alloc import _torch

    ump_alloc.enable(cupy=False, torch=True)
    assert _torch.attached(), "ump_torch_attach failed"
    wrong, reused = _record_stream_trials(record=False)
    print(f"control, no record_stream: {wrong}/10 wrong sums, {reused}/10 blocks reused")
    assert reused > 0 and wrong > 0, "the control did not reproduce the race: the check cannot fail"
    wrong, reused = _record_stream_trials(record=True)
    print(f"record_stream: {wrong}/10 wrong sums, {reused}/10 blocks reused at once")
    assert wrong == 0, f"{wrong}/10 sums wrong: a recorded block was reused under the side stream"
    # Deferred blocks do go back: after the streams finish, the cache serves them again.
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    x = torch.ones(16 << 20, dtype=torch.int32, device="cuda")
    with torch.cuda.stream(side):
        x.sum()  # the side stream's pool exists before the baseline
    del x
    side.synchronize()
    before = ump_alloc.stats()["devices"][0]["mapped"]
    for _ in range(5):
        x = torch.ones(16 << 20, dtype=torch.int32, device="cuda")
        with torch.cuda.stream(side):
            x.sum()
        x.record_stream(side)
        del x
        side.synchronize()
    after = ump_alloc.stats()["devices"][0]["mapped"]
    assert after <= before + (128 << 20), f"deferred blocks pile up: {before >> 20} -> {after >> 20} MiB"
    # A double free of a deferred block is refused, not a second free.
    L = _lib_handle()
    p = L.ump_torch_malloc(1 << 20, 0, None)
    s2 = torch.cuda.Stream()
    with torch.cuda.stream(s2):
        torch.cuda._sleep(int(20e-3 * 1.5e9))
    assert L.ump_torch_record_stream(p, ctypes.c_void_p(s2.cuda_stream)) == 0
    errors = L.ump_error_count()
    L.ump_torch_free(p, 1 << 20, 0, None)
    L.ump_torch_free(p, 1 << 20, 0, None)
    assert L.ump_error_count() == errors + 1 and "double free" in ump_alloc.last_error()
    s2.synchronize()


def _lib_handle():
    from ump_alloc import _lib

    return _lib.lib()


def torch_empty_cache_and_fraction():
    """torch.cuda.empty_cache() gives ump-alloc's device cache back; set_per_process_memory_fraction
    is a limit (torch.OutOfMemoryError past it), and raising it again lifts it."""
    import torch

    import ump_alloc
    from ump_alloc import _torch

    ump_alloc.enable(cupy=False, torch=True)
    assert _torch.attached()
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    mapped = ump_alloc.stats()["devices"][0]["mapped"]
    assert mapped >= 1 << 30, "the freed GiB should stay cached"
    torch.cuda.empty_cache()
    after = ump_alloc.stats()["devices"][0]["mapped"]
    assert after <= mapped - (1 << 30), f"empty_cache gave back {(mapped - after) >> 20} MiB"
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.05, 0)
    cap = int(total * 0.05)
    a = torch.empty(cap // 2, dtype=torch.uint8, device="cuda")
    try:
        b = torch.empty(cap // 2 + (256 << 20), dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        assert "fraction" in str(e), str(e)
    else:
        raise AssertionError(f"no OutOfMemoryError past the fraction ({b.numel() >> 20} MiB)")
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    b = torch.empty(cap // 2 + (256 << 20), dtype=torch.uint8, device="cuda")
    b.fill_(2)
    a.fill_(1)
    assert int(b[-10:].sum()) == 20 and int(a[:10].sum()) == 10


def system_mode_refused():
    import ump_alloc

    try:
        ump_alloc.enable()
    except ump_alloc.UmpError as e:
        msg = str(e)
        assert "pageable memory access" in msg and "UMP_ALLOC_MODE=pinned" in msg, msg
        print("refused:", msg)
    else:
        raise AssertionError("mode system was accepted on a GPU without HMM")


def auto_mode():
    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    c = ump_alloc.capabilities()
    print("auto ->", ump_alloc.mode(), "|", c["mode_reason"])
    print("  host side:", c["host_side"], "|", c["host_reason"])
    print("  device side:", c["device_side"], "|", c["device_reason"])
    d = c["devices"][0]
    if d["pageable_memory_access"]:
        assert ump_alloc.mode() == "system"
    else:
        assert c["host_side"] == "pinned", c
        assert c["device_side"] == ("managed" if d["concurrent_managed_access"] else "pinned"), c
    a = np.ones(1000)
    ident = ump_alloc.identify(a)
    assert ident.kind == {"pinned": "registered", "system": "system"}[c["host_side"]], ident
    # Pinned host memory is pinned at the process's first use of a GPU (UMP_ALLOC_PIN=lazy).
    assert ident.device_accessible == (c["host_side"] != "pinned"), ident
    _first_gpu_use()
    assert ump_alloc.identify(a).device_accessible, ump_alloc.identify(a)


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


# ---- zero-copy (issue 4) -----------------------------------------------------------------------

_HASH = r"""
unsigned int h = (unsigned int)i * 2654435761u + seed;
h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
y = (float)(h & 0xFFFFFF) / 16777216.0f;
"""


def _host_hash(n, seed):
    i = np.arange(n, dtype=np.uint32)
    h = (i * np.uint32(2654435761) + np.uint32(seed)).astype(np.uint32)
    h ^= h >> np.uint32(15)
    h = (h * np.uint32(2246822519)).astype(np.uint32)
    h ^= h >> np.uint32(13)
    return ((h & np.uint32(0xFFFFFF)).astype(np.float32) / np.float32(16777216.0)).astype(np.float32)


def _spin(stream, ms):
    """Queue a kernel that keeps `stream` busy for about `ms` milliseconds."""
    import cupy as cp

    k = cp.RawKernel(
        r"""extern "C" __global__ void spin(long long cycles) {
            long long t0 = clock64(); while (clock64() - t0 < cycles) { } }""",
        "spin",
    )
    with stream:
        k((1,), (1,), (np.int64(int(ms * 1.5e6)),))


def stream_correctness():
    """A kernel writes hashed-random data on a non-default stream behind a slow kernel; the
    zero-copy view must see every element after asnumpy(x, stream=s). The reverse too."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    s = cp.cuda.Stream(non_blocking=True)
    fill = cp.ElementwiseKernel("uint32 seed", "float32 y", _HASH, "ump_hash")
    iters = int(os.environ.get("UMP_STREAM_ITERS", "12"))
    for it in range(iters):
        n = [64 * 2**20 // 4, 3 * 2**20 + 5, 256 * 2**20 // 4][it % 3]
        with s:
            x = cp.empty(n, cp.float32)
            x.fill(cp.nan)  # poison
        s.synchronize()
        _spin(s, 20)  # the write below lands ~20 ms later
        with s:
            fill(np.uint32(it * 7919), x)
        h = ump_alloc.asnumpy(x, stream=s, copy=False)  # the view (the copy: transfer_choice_cupy)
        assert isinstance(h.base, ump_alloc.ZeroCopyBuffer) and ump_alloc.is_zero_copy(h, x)
        expect = _host_hash(n, it * 7919)
        assert not np.isnan(h).any(), f"iteration {it}: the view saw poison (stream not synchronised)"
        np.testing.assert_array_equal(h, expect)
        # Reverse: host writes, then asarray orders them before the next kernel on s.
        a = np.empty(n, np.float32)
        a[:] = expect[::-1]
        g = ump_alloc.asarray(a, like="cupy", stream=s, copy=False)
        assert ump_alloc.is_zero_copy(a, g)
        with s:
            out = g * 2
            total = float(out[:: max(1, n // 1000)].sum().get())
        assert total == float((expect[::-1][:: max(1, n // 1000)] * 2).sum(dtype=np.float32)) or abs(
            total - float((expect[::-1][:: max(1, n // 1000)].astype(np.float64) * 2).sum())
        ) < 1e-2 * max(1.0, abs(total))
        s.synchronize()
        np.testing.assert_array_equal(cp.asnumpy(out), expect[::-1] * 2)


def asnumpy_paths():
    """Views keep shape, strides, dtype and the source alive; copies are plain copies."""
    import gc

    import cupy as cp
    import torch

    import ump_alloc

    ump_alloc.enable(torch=True)
    cp.random.seed(3)
    g = cp.random.standard_normal((300, 200), dtype=cp.float64)
    ref = cp.asnumpy(g)
    for view in (g, g.T, g[::3, 5:], g[::-1, ::-2]):
        h = ump_alloc.asnumpy(view, copy=False)
        assert ump_alloc.is_zero_copy(h, g) and isinstance(h.base, ump_alloc.ZeroCopyBuffer)
        assert h.shape == view.shape and h.strides == view.strides and h.dtype == view.dtype
        np.testing.assert_array_equal(h, cp.asnumpy(view))
    h = ump_alloc.asnumpy(g, copy=False)
    del g
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    junk = cp.ones((300, 200), cp.float64) * 7  # would reuse the block if it had been freed
    cp.cuda.get_current_stream().synchronize()
    np.testing.assert_array_equal(h, ref)
    z = ump_alloc.asnumpy(cp.empty((0, 3), cp.float32))
    assert z.shape == (0, 3) and z.dtype == np.float32
    # torch tensors on ump memory (made while enabled: disable() below gives PyTorch's new
    # segments back to CUDA).
    t = torch.arange(1000, dtype=torch.float32, device="cuda").reshape(10, 100)
    ht = ump_alloc.asnumpy(t.t(), copy=False)
    assert ump_alloc.is_zero_copy(ht, t) and ht.shape == (100, 10)
    np.testing.assert_array_equal(ht, t.t().cpu().numpy())
    # A CuPy array from another allocator is copied.
    ump_alloc.disable()
    plain = cp.arange(10, dtype=cp.int32)
    c = ump_alloc.asnumpy(plain)
    assert c.base is None or not isinstance(c.base, ump_alloc.ZeroCopyBuffer)
    assert not ump_alloc.is_zero_copy(c, plain) and c.tolist() == list(range(10))
    del junk


def asarray_paths():
    import cupy as cp
    import torch

    import ump_alloc

    ump_alloc.enable(torch=True)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((400, 300)).astype(np.float32)
    g = ump_alloc.asarray(a, like="cupy", copy=False)
    assert ump_alloc.is_zero_copy(a, g) and g.shape == a.shape
    np.testing.assert_array_equal(cp.asnumpy(g), a)
    gs = ump_alloc.asarray(a[::2, ::-3], like="cupy", copy=False)
    assert ump_alloc.is_zero_copy(a, gs)
    np.testing.assert_array_equal(cp.asnumpy(gs), a[::2, ::-3])
    g *= 2  # GPU write, visible to the host after a sync
    cp.cuda.get_current_stream().synchronize()
    assert np.allclose(a[0, :5], cp.asnumpy(g[0, :5]))
    t = ump_alloc.asarray(a, like="torch", copy=False)
    assert t.data_ptr() == a.ctypes.data and t.is_cuda
    t.add_(1)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(a, cp.asnumpy(g))
    ro = a.copy()
    ro.flags.writeable = False
    c = ump_alloc.asarray(ro, like="cupy", touch=0.01)
    assert not ump_alloc.is_zero_copy(ro, c)  # a GPU view could not keep it read-only
    try:
        ump_alloc.asarray(ro, like="cupy", copy=False)
        raise AssertionError("copy=False on a read-only array must raise")
    except ValueError as e:
        assert "read-only" in str(e), e
    raw = np.zeros(4001, np.uint8)
    mis = raw[1:].view(np.float32)  # address not aligned to 4
    cm = ump_alloc.asarray(mis, like="cupy", touch=0.01)
    assert not ump_alloc.is_zero_copy(mis, cm)
    assert ump_alloc.asarray(np.empty((0, 5)), like="cupy").shape == (0, 5)
    ump_alloc.disable()
    foreign = np.arange(100.0)  # NumPy's default allocator: pageable, not reachable here
    cf = ump_alloc.asarray(foreign, like="cupy")
    assert not ump_alloc.is_zero_copy(foreign, cf) and float(cf.sum().get()) == 4950.0


if __name__ == "__main__":
    name = sys.argv[1]
    globals()[name]()
    print("PASS", name)


# ---- issue 5: stream-ordered reuse, scopes, statistics, headroom ------------------------------


def _rand_u32(xp, n, seed):
    return xp.asarray(np.random.default_rng(seed).integers(1, 2**31, n, dtype=np.int64).astype(np.uint32))


def stream_reuse_cupy():
    """A kernel is still writing a freed block (it waits behind a 30 ms spin on stream s1) when
    another stream allocates the same size and writes its own random data. ump-alloc must not
    let s2's data be overwritten. A control proves the check detects a violation."""
    import cupy as cp

    import ump_alloc

    from ump_alloc import _cupy

    ump_alloc.enable(torch=False)
    assert _cupy.fast_path() and cp.cuda.get_allocator().__name__ == "ump_cupy_allocator_direct"
    s1 = cp.cuda.Stream(non_blocking=True)
    s2 = cp.cuda.Stream(non_blocking=True)
    reused = 0
    for it, nbytes in enumerate([1 << 20, 64 << 20, 3 << 20, 96 << 20] * 3):
        n = nbytes // 4
        a_src = _rand_u32(cp, n, 2 * it)
        b_src = _rand_u32(cp, n, 2 * it + 1)
        b_host = cp.asnumpy(b_src)
        cp.cuda.Device().synchronize()
        with s1:
            x = cp.empty(n, cp.uint32)
            x_ptr = x.data.ptr
        _spin(s1, 30)
        with s1:
            x[...] = a_src  # lands ~30 ms from now
        del x  # freed while the write is queued
        with s2:
            y = cp.empty(n, cp.uint32)
            y[...] = b_src
        reused += y.data.ptr == x_ptr
        s2.synchronize()
        s1.synchronize()
        got = cp.asnumpy(y)
        assert (got == b_host).all(), (
            f"iteration {it} ({nbytes} bytes): {(got != b_host).sum()} elements of the new block were "
            f"overwritten by a kernel queued before the free (reused={y.data.ptr == x_ptr})"
        )
        # Same stream: the block comes back at once (stream order makes it safe).
        with s1:
            p = cp.empty(n, cp.uint32)
            pp = p.data.ptr
            del p
            q = cp.empty(n, cp.uint32)
            assert q.data.ptr == pp, "same-stream reuse must be immediate"
            del q
        del y
    st = ump_alloc.stats()
    print(f"cross-stream reuses of the same address: {reused}; stream_waits {st['stream_waits']}, "
          f"stream_syncs {st['stream_syncs']}, streams {st['streams']}")
    assert reused > 0, "no idle chunk moved between streams: the event path was not exercised"
    if ump_alloc.mode() != "registered":  # see stream_reuse_torch
        assert st["stream_waits"] + st["stream_syncs"] > 0

    # Control: a violating allocator (s2 writing the same memory with no ordering) is caught.
    n = (64 << 20) // 4
    a_src, b_src = _rand_u32(cp, n, 99), _rand_u32(cp, n, 100)
    b_host = cp.asnumpy(b_src)
    cp.cuda.Device().synchronize()
    with s1:
        x = cp.empty(n, cp.uint32)
    _spin(s1, 30)
    with s1:
        x[...] = a_src
    alias = cp.ndarray((n,), cp.uint32, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(x.data.ptr, 4 * n, x), 0))
    with s2:
        alias[...] = b_src
    s2.synchronize()
    s1.synchronize()
    caught = (cp.asnumpy(alias) != b_host).any()
    print(f"control: unordered reuse detected: {bool(caught)}")
    if ump_alloc.mode() != "registered":  # see stream_reuse_torch
        assert caught, "control: the check failed to see an unordered reuse"
    del alias, x

    # Streams destroyed while their blocks live: the blocks are freed later, safely, and a new
    # stream that gets the same handle starts afresh.
    for i in range(20):
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            a = cp.full((16 << 20) // 4 if i % 2 else 1000, i, cp.uint32)
        _spin(s, 2)
        del s  # CuPy destroys the stream here; ump-alloc retired it first
        s3 = cp.cuda.Stream(non_blocking=True)
        with s3:
            b = cp.full(a.size, 7, cp.uint32)
        s3.synchronize()
        cp.cuda.Device().synchronize()
        assert (cp.asnumpy(a) == i).all() and (cp.asnumpy(b) == 7).all()
        del a, b, s3
    print("destroyed streams: ok")


def stream_reuse_torch():
    """The same check through PyTorch's pluggable allocator, which passes the stream to free."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    reused = 0
    gen = torch.Generator(device="cpu").manual_seed(5)
    for it, nbytes in enumerate([2 << 20, 64 << 20, 200 << 10, 80 << 20] * 3):
        n = nbytes // 4
        a_src = torch.randint(1, 2**30, (n,), generator=gen, dtype=torch.int32).cuda()
        b_src = torch.randint(1, 2**30, (n,), generator=gen, dtype=torch.int32).cuda()
        b_host = b_src.cpu()
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            x = torch.empty(n, dtype=torch.int32, device="cuda")
            x_ptr = x.data_ptr()
            torch.cuda._sleep(int(30e-3 * 1.5e9))
            x.copy_(a_src)
        del x
        with torch.cuda.stream(s2):
            y = torch.empty(n, dtype=torch.int32, device="cuda")
            y.copy_(b_src)
        reused += y.data_ptr() == x_ptr
        s2.synchronize()
        torch.cuda.synchronize()
        got = y.cpu()
        assert torch.equal(got, b_host), (
            f"iteration {it} ({nbytes} bytes): {(got != b_host).sum().item()} elements overwritten "
            f"by a kernel queued before the free"
        )
        del y
    st = ump_alloc.stats()
    print(f"torch cross-stream reuses: {reused}; stream_waits {st['stream_waits']}, streams {st['streams']}")
    assert reused > 0, "no idle chunk moved between streams"
    # The data check above is the safety check. In registered mode the events were already
    # complete whenever a chunk moved (seen on the H200), so no device-side wait was needed.
    if ump_alloc.mode() != "registered":
        assert st["stream_waits"] + st["stream_syncs"] > 0


def stats_and_peaks_torch():
    """PyTorch's peak memory from ump_alloc.stats() (the pluggable path has none of its own)."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True)
    torch.ones(1, device="cuda")
    ump_alloc.reset_peak()
    d0 = ump_alloc.stats()["devices"][0]
    a = torch.empty(100 << 20, dtype=torch.uint8, device="cuda")
    b = torch.empty(50 << 20, dtype=torch.uint8, device="cuda")
    d1 = ump_alloc.stats()["devices"][0]
    assert d1["in_use"] - d0["in_use"] == 150 << 20, (d0, d1)
    assert d1["allocs"] >= d0["allocs"] + 2
    del a, b
    d2 = ump_alloc.stats()["devices"][0]
    assert d2["in_use"] == d0["in_use"] and d2["in_use_peak"] >= d0["in_use"] + (150 << 20)
    assert d2["cached"] >= 150 << 20 and d2["frees"] >= d0["frees"] + 2
    ump_alloc.reset_peak()
    assert ump_alloc.stats()["devices"][0]["in_use_peak"] == d2["in_use"]
    c = torch.empty(10 << 20, dtype=torch.uint8, device="cuda")
    d3 = ump_alloc.stats()["devices"][0]
    assert d3["hits"] > d2["hits"], "a cached block must count as a hit"
    del c
    freed = ump_alloc.trim()
    d4 = ump_alloc.stats()["devices"][0]
    assert freed >= 150 << 20 and d4["mapped"] <= d2["mapped"] - (150 << 20), (freed, d2, d4)
    print("stats:", {k: d4[k] for k in ("in_use", "in_use_peak", "mapped", "mapped_peak", "cached", "hits", "misses")})


def scope_loop_is_flat():
    """1000 iterations inside ump_alloc.scope(): device and host memory stay flat, and the
    scope reports what escaped."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(0)
    mapped = []
    for it in range(1000):
        with ump_alloc.scope() as s:
            n = int(rng.integers(1000, 300_000))
            x = cp.asarray(rng.random(n, dtype=np.float32))
            y = cp.sqrt(x) * 2
            h = np.asarray(cp.asnumpy(y))
            assert np.allclose(h, np.sqrt(cp.asnumpy(x)) * 2)
        r = s.report
        assert r.allocs >= 3 and r.live_blocks >= 2, r  # x, y and h are still referenced
        if it >= 10:
            st = ump_alloc.stats()
            mapped.append((st["devices"][0]["mapped"], st["host"]["mapped"]))
    assert mapped[0] == mapped[-1], f"memory grew across the loop: {mapped[0]} -> {mapped[-1]}"
    print("flat at", mapped[-1])


def headroom_keeps_device_memory_free():
    """UMP_ALLOC_HEADROOM: with (free - 512 MiB) of headroom, 2 GiB of CuPy arrays may take at
    most about 512 MiB of device memory; the rest lives in host memory, and kernels still
    compute the right values on it."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    free0 = cp.cuda.runtime.memGetInfo()[0]
    arrs = []
    for i in range(4):
        a = cp.empty((512 << 20) // 4, cp.float32)
        a[...] = cp.float32(i + 1.5)  # the kernel touches every page
        arrs.append(a)
    cp.cuda.Device().synchronize()
    free1 = cp.cuda.runtime.memGetInfo()[0]
    used = free0 - free1
    print(f"2 GiB allocated and written; device memory used: {used / 2**20:.0f} MiB")
    assert used <= (768 << 20), f"headroom not kept: {used / 2**20:.0f} MiB of device memory used"
    for i, a in enumerate(arrs):
        h = ump_alloc.asnumpy(a)
        assert (h == np.float32(i + 1.5)).all()


def pinned_cap_fallback():
    """Past UMP_ALLOC_PINNED_LIMIT, NumPy gets plain host memory: one warning, a counter, arrays
    that work, and GPU libraries that copy them instead of reading them in place."""
    import io
    import contextlib
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(3)
    arrays = [rng.random(4 * 2**20 // 8) for _ in range(24)]  # 24 x 4 MiB against a 64 MiB cap
    kinds = [ump_alloc.identify(a).kind for a in arrays]
    print("kinds:", kinds)
    assert kinds[0] == "registered" and kinds[-1] == "host", kinds
    s = ump_alloc.stats()
    assert s["host_fallback"]["allocs"] > 0 and s["pinned"]["bytes"] <= s["pinned"]["cap"] == 64 << 20, s
    for a in arrays:
        g = cp.asarray(a)                          # a copy either way
        np.testing.assert_array_equal(cp.asnumpy(g), a)
        v = ump_alloc.asarray(a, like="cupy", touch=0.01)  # a view only where the GPU reaches it
        assert ump_alloc.is_zero_copy(a, v) == (ump_alloc.identify(a).kind == "registered")
        np.testing.assert_array_equal(cp.asnumpy(v * 2), a * 2)
    # The warning came once.
    print("fallback allocations:", s["host_fallback"])


def fork_child_of_a_cuda_process():
    """After fork(), the child reads and writes the parent's NumPy arrays, makes new ones without
    any CUDA call, and CuPy use there fails with a clear error, not a crash."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(9)
    parent = rng.random(8 * 2**20 // 8)
    want = float(parent.sum())
    g = cp.asarray(parent)                         # CUDA is in use in the parent
    assert float(g.sum()) == want
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            assert float(parent.sum()) == want     # read
            parent[:10] = -1                       # write (the child's own copy)
            kids = [np.full(n, 2.0) for n in (10, 1000, 2**20, 16 * 2**20)]  # allocate
            assert all(float(k[-1]) == 2.0 and ump_alloc.handles(k) for k in kids)
            assert ump_alloc.stats()["host_fallback"]["allocs"] >= 0
            try:
                cp.zeros(10) + 1
                msg = "no error"
            except Exception as e:  # noqa: BLE001
                msg = f"{type(e).__name__}: {e}"
            os.write(w, msg.encode()[:500])
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    msg = os.read(r, 600).decode()
    print("child status", status, "| CuPy in the child:", msg)
    assert status == 0, status
    assert msg and msg != "no error", msg
    assert float(parent.sum()) == want, "the child's writes stayed in the child"


def dataloader_fork_workers():
    """torch DataLoader(num_workers=4), fork start method, over a Dataset of NumPy arrays made on
    ump-alloc, batches sent to the GPU: right batches, no crash, no hang."""
    import torch
    from torch.utils.data import DataLoader, Dataset

    import ump_alloc

    assert ump_alloc.handles(np.ones(10)), "UMP_ALLOC=1 put NumPy on ump-alloc"
    rng = np.random.default_rng(21)
    data = [rng.random((64, 64)).astype(np.float32) for _ in range(256)]
    model = torch.nn.Linear(64, 8).cuda()          # CUDA in use in the parent before the fork

    class DS(Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, i):
            x = data[i] * 2.0                      # a new array in the worker
            return torch.from_numpy(x), i

    dl = DataLoader(DS(), batch_size=16, num_workers=4, multiprocessing_context="fork", timeout=120)
    seen = 0
    for x, idx in dl:
        x = x.cuda(non_blocking=True)
        expect = torch.from_numpy(np.stack([data[i] * 2.0 for i in idx.tolist()])).cuda()
        assert torch.equal(x, expect)
        model(x).sum().item()
        seen += len(idx)
    assert seen == len(data)
    print("batches ok:", seen)


def numba_emm():
    """Numba's device arrays come from ump-alloc through the EMM plugin (NUMBA_CUDA_MEMORY_MANAGER
    is set by the test): a CuPy kernel fills a poisoned Numba array with random data through its
    __cuda_array_interface__ (Numba's own JIT is not needed, so a numba-cuda that cannot compile
    kernels here does not hide the allocator), identify() knows it, get_memory_info() is sane,
    and defer_cleanup() holds frees back."""
    import cupy as cp
    import numba
    from numba import cuda

    import ump_alloc
    import ump_alloc.numba as un

    assert os.environ.get("NUMBA_CUDA_MEMORY_MANAGER") == "ump_alloc.numba"
    ctx = cuda.current_context()
    assert isinstance(ctx.memory_manager, un.UmpNumbaManager), type(ctx.memory_manager)
    n = 3_000_001
    rng = np.random.default_rng(int.from_bytes(os.urandom(3), "little"))
    h = rng.integers(0, 2**40, n, dtype=np.int64)
    d = cuda.to_device(np.full(n, -1, dtype=np.int64))  # poisoned
    view = cp.asarray(d)  # the same memory, through __cuda_array_interface__
    assert view.data.ptr == d.__cuda_array_interface__["data"][0]
    view[...] = cp.asarray(h) * 3 + 1
    cp.cuda.get_current_stream().synchronize()
    assert np.array_equal(d.copy_to_host(), h * 3 + 1), "data written by the GPU differs"
    ident = ump_alloc.identify(d.__cuda_array_interface__["data"][0])
    assert ident.ours and ident.device_accessible and ident.size >= n * 8, ident
    free, total = ctx.get_memory_info()
    assert 0 < free <= total, (free, total)
    del view
    before = ump_alloc.stats()["devices"][0]["in_use"]
    with cuda.defer_cleanup():
        big = cuda.device_array(64 << 20, dtype=np.uint8)
        mid = ump_alloc.stats()["devices"][0]["in_use"]
        assert mid >= before + (64 << 20), (before, mid)
        del big
        ctx.memory_manager.deallocations.clear()  # deferred: nothing is freed inside defer_cleanup
        assert ump_alloc.stats()["devices"][0]["in_use"] == mid, "freed inside defer_cleanup"
    ctx.memory_manager.deallocations.clear()
    assert ump_alloc.stats()["devices"][0]["in_use"] <= mid - (64 << 20), "never freed"
    print(f"numba {numba.__version__}: EMM plugin ok, memory info {free >> 20}/{total >> 20} MiB")


def _cupy_allocator_checks(cp, ump_alloc, label):
    """Blocks from ump-alloc with right data, same-stream reuse on a side stream, and CuPy's
    OutOfMemoryError over UMP_ALLOC_LIMIT, through the allocator installed now."""
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    h = rng.integers(0, 2**31, 1 << 20, dtype=np.int64)
    x = cp.full(h.shape, -1, dtype=cp.int64)  # poisoned
    x[...] = cp.asarray(h) * 3 + 1
    assert np.array_equal(cp.asnumpy(x), h * 3 + 1), label
    assert ump_alloc.identify(x).ours, label
    tiny = cp.asarray(h[:7])  # a small block (the slab path)
    assert ump_alloc.identify(tiny).ours and np.array_equal(cp.asnumpy(tiny), h[:7]), label
    s1 = cp.cuda.Stream(non_blocking=True)
    with s1:
        y = cp.empty(1 << 20, dtype=cp.uint8)
        yp = y.data.ptr
        del y
        z = cp.empty(1 << 20, dtype=cp.uint8)
        assert z.data.ptr == yp, f"{label}: same stream: a freed block is reused at once"
        del z
    w = cp.empty(1 << 20, dtype=cp.uint8)  # the default stream: not s1's partly used arena
    assert w.data.ptr != yp, label
    assert cp.empty(0, dtype=cp.uint8).data.ptr == 0  # size 0: CuPy's own null block
    try:
        cp.empty(1 << 30, dtype=cp.uint8)
    except cp.cuda.memory.OutOfMemoryError as e:
        assert "UMP_ALLOC_LIMIT" in str(e), str(e)
    else:
        raise AssertionError(f"{label}: no OutOfMemoryError over the limit")
    # After the error, allocation works again and data is right.
    v = cp.arange(1000, dtype=cp.int64)
    assert int(v.sum()) == 999 * 1000 // 2, label
    del s1


def cupy_fast_path():
    """CuPy allocates through the C-implemented allocator (no Python per allocation): blocks
    come from ump-alloc, kernels see right data, a block freed on one stream is reused on that
    stream, and an OOM still raises CuPy's OutOfMemoryError (run with UMP_ALLOC_LIMIT=256M).
    Both builtins: the direct one (installed) and the one over CFunctionAllocator.malloc."""
    import cupy as cp

    import ump_alloc
    from ump_alloc import _cupy

    ump_alloc.enable(torch=False)
    assert _cupy.fast_path(), "the C fast path is not in use"
    a = cp.cuda.get_allocator()
    assert type(a).__name__ == "builtin_function_or_method" and a.__name__ == "ump_cupy_allocator_direct", a
    _cupy_allocator_checks(cp, ump_alloc, "direct")
    bound = _cupy._make_fast_allocator(cp, direct=False)
    assert bound.__name__ == "ump_cupy_allocator"
    cp.cuda.set_allocator(bound)
    _cupy_allocator_checks(cp, ump_alloc, "bound")
    cp.cuda.set_allocator(a)
    st = ump_alloc.stats()
    print(f"fast path ok ({_cupy.describe()}); streams {st['streams']}")


def cupy_stream_retirement():
    """A CuPy stream is retired in ump-alloc when CuPy destroys it (the patched Stream.__del__):
    its pool is marked retired, its idle memory goes back for other streams (mapped memory stays
    flat over 12 streams of 64 MiB each) and pools are recycled. Control: with CuPy's original
    __del__, the destroyed stream's pool is not retired."""
    import cupy as cp

    import ump_alloc
    from ump_alloc import _cupy

    ump_alloc.enable(torch=False)
    assert _cupy.fast_path()
    n = (64 << 20) // 4

    def pool_of(ptr):
        return [p for p in ump_alloc.pool_stats() if p["device"] == 0 and p["stream"] == ptr]

    def device_mapped():
        return sum(p["mapped"] for p in ump_alloc.pool_stats() if p["device"] == 0)

    seed = int.from_bytes(os.urandom(2), "little")
    peak = 0
    for i in range(12):
        s = cp.cuda.Stream(non_blocking=True)
        ptr = s.ptr
        with s:
            x = _rand_u32(cp, n, seed + i)
            want = cp.asnumpy(x)
            y = x * 2 + 1
        s.synchronize()  # y is produced on s; the copy below runs on the legacy default stream
        got = cp.asnumpy(y)
        assert np.array_equal(got, want * 2 + 1)
        del x, y
        s.synchronize()
        assert pool_of(ptr) and not pool_of(ptr)[0]["retired"]
        del s  # CuPy destroys the stream; ump-alloc retires it first
        mine = pool_of(ptr)
        assert mine and all(p["retired"] for p in mine), f"stream {ptr:#x} not retired: {mine}"
        assert all(p["mapped"] == 0 for p in mine), f"a retired stream's pool kept memory: {mine}"
        peak = max(peak, device_mapped())
    pools = [p for p in ump_alloc.pool_stats() if p["device"] == 0]
    print(f"retirement: {len(pools)} device pools after 12 streams, peak device mapped {peak >> 20} MiB")
    assert peak <= 4 * (64 << 20) + (256 << 20), f"mapped memory grew with each stream: {peak}"
    assert len(pools) <= 6, f"pools of retired streams were not recycled: {len(pools)}"

    # Control: CuPy's own __del__ alone leaves the pool unretired.
    patched = cp.cuda.Stream.__del__
    cp.cuda.Stream.__del__ = _cupy._state["stream_del"]
    try:
        s = cp.cuda.Stream(non_blocking=True)
        ptr = s.ptr
        with s:
            x = cp.ones(n, cp.uint32)
        del x
        s.synchronize()
        del s
        mine = pool_of(ptr)
        assert mine and not any(p["retired"] for p in mine), f"control: retired without the patch: {mine}"
        # Not retired now: the handle is destroyed, and recording an event on it would be
        # undefined behaviour (it crashed in pinned mode). The process ends here.
    finally:
        cp.cuda.Stream.__del__ = patched
    print("control: without the patch the destroyed stream's pool stays live: ok")


def _fresh_cuda(torch, n, dtype, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(n, generator=g).to(dtype).cuda()
    if dtype == torch.bool:
        return (torch.randint(0, 2, (n,), generator=g) == 1).cuda()
    return torch.randint(-(2**30), 2**30, (n,), generator=g).to(dtype).cuda()


def _poison_host(nbytes):
    """Leave freed host-side memory full of 0xA5 bytes, so that a copy that writes nothing shows."""
    junk = [np.full(nbytes + k * 4096, 0xA5, np.uint8) for k in range(3)]
    del junk


def torch_fast_cpu():
    """UMP_ALLOC=1: .cpu()/.to(cpu)/.numpy(force=True) of CUDA tensors land in ump-alloc's host
    side (registered, pinned) with results bit-equal to PyTorch's own path (values, dtype, shape,
    strides) for every .to() signature; destinations are poisoned first. Autograd gradients,
    non_blocking (pinned by PyTorch), inference mode, small and non-dense tensors behave as
    before. With UMP_ALLOC_TORCH_FAST_CPU=0 (the control) nothing is ours."""
    import torch

    import ump_alloc
    from ump_alloc import _torch_transfer as tt

    fast = os.environ.get("UMP_ALLOC_TORCH_FAST_CPU", "1") == "1"
    ump_alloc.enable(cupy=False, torch=True)
    assert tt.active()["fast_cpu"] == fast, tt.active()
    orig_cpu = tt._orig.get("cpu", torch.Tensor.cpu)
    orig_to = tt._orig.get("to", torch.Tensor.to)
    host_kind = ump_alloc.stats()["host_kind"]
    assert host_kind == _expect_host_kind(), host_kind
    seed = int.from_bytes(os.urandom(2), "little")

    def same(got, want, what, ours=fast):
        assert got.device.type == "cpu", what
        assert (got.dtype, got.shape, got.stride()) == (want.dtype, want.shape, want.stride()), (
            what, got.dtype, got.shape, got.stride(), want.stride())
        assert torch.equal(got, want), what
        assert got.requires_grad == want.requires_grad, what
        ident = ump_alloc.identify(got)
        assert ident.ours == ours, (what, ident)
        if ours:
            assert ident.kind == host_kind, (what, ident)

    for i, dtype in enumerate((torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16)):
        t = _fresh_cuda(torch, (3 << 20) + 7, dtype, seed + i).view(-1)
        ref = orig_cpu(t)
        cases = (("cpu", lambda: t.cpu()), ("to", lambda: t.to("cpu")),
                 ("to device", lambda: t.to(torch.device("cpu"))),
                 ("2d", lambda: t[: (3 << 20)].view(1024, -1).cpu()))
        for name, make in cases:
            _poison_host(t.nbytes)
            got = make()
            want = ref if name != "2d" else ref[: (3 << 20)].view(1024, -1)
            same(got, want, (name, dtype))
        if dtype != torch.bfloat16:  # NumPy has no bfloat16: PyTorch refuses .numpy() itself
            _poison_host(t.nbytes)
            n = t.numpy(force=True)
            assert np.array_equal(n, ref.numpy()) and ump_alloc.identify(n).ours == fast
    # Every .to() signature that lands on the CPU, against PyTorch's own .to() with the same arguments.
    t = _fresh_cuda(torch, 1 << 21, torch.float32, seed)
    other = torch.zeros(3, dtype=torch.float64)
    signatures = [
        (("cpu", torch.float16), {}), (("cpu",), {"dtype": torch.float64}),
        (("cpu", torch.float16, False), {}),  # nn.Module.to's call
        (("cpu", torch.float16, False, True), {}),  # copy by position
        (("cpu",), {"copy": True}), ((), {"device": "cpu", "dtype": torch.int32, "copy": True}),
        (("cpu",), {"memory_format": torch.preserve_format}), ((other,), {}), ((other, False, True), {}),
        (("cpu:0",), {}),
    ]
    for args, kwargs in signatures:
        _poison_host(t.nbytes * 2)
        same(t.to(*args, **kwargs), orig_to(t, *args, **kwargs), ("to", args, kwargs))
    for bad_args, bad_kwargs in ((("cpu", torch.float16, False, True, 5), {}), (("cpu", torch.float16, False, True), {"copy": True})):
        try:
            t.to(*bad_args, **bad_kwargs)
        except TypeError:
            pass
        else:
            raise AssertionError(f"to{bad_args} {bad_kwargs} must raise PyTorch's TypeError")
    same(t[:100].cpu(), orig_cpu(t[:100]), "small", ours=False)
    nb = t.to("cpu", non_blocking=True)
    torch.cuda.synchronize()
    assert nb.is_pinned(), "non_blocking=True: PyTorch's pinned destination"
    same(nb, orig_cpu(t), "non_blocking", ours=False)
    # Layouts: dense ones keep their exact strides (channels-last, transposed, odd size-1
    # strides), as PyTorch's empty_strided does; gapped views take PyTorch's path.
    x = _fresh_cuda(torch, 8 * 64 * 32 * 32, torch.float32, seed + 7)
    layouts = {
        "channels_last": x.view(8, 64, 32, 32).to(memory_format=torch.channels_last),
        "transposed": x.view(2048, 256).t(),
        "size-1 stride": x.as_strided((2048, 1, 256), (256, 7, 1)),
    }
    for name, v in layouts.items():
        _poison_host(v.nbytes)
        same(v.cpu(), orig_cpu(v), name)
        n = v.numpy(force=True)
        assert n.strides == orig_cpu(v).numpy().strides and np.array_equal(n, orig_cpu(v).numpy()), name
    cl = layouts["channels_last"]
    same(cl.cpu(memory_format=torch.contiguous_format), orig_cpu(cl, memory_format=torch.contiguous_format),
         "explicit memory_format", ours=False)
    same(cl.to("cpu", memory_format=torch.contiguous_format),
         orig_to(cl, "cpu", memory_format=torch.contiguous_format), "explicit memory_format .to", ours=False)
    same(x[::2].cpu(), orig_cpu(x[::2]), "gapped", ours=False)
    # Autograd: a source autograd tracks takes PyTorch's path, gradients equal bit for bit.
    w0 = torch.randn(1 << 20, device="cuda")
    k = torch.randn(1 << 20)
    grads = []
    for cpu in (torch.Tensor.cpu, orig_cpu):
        w = w0.clone().requires_grad_()
        y = cpu(w * w)
        assert y.requires_grad and y.grad_fn is not None
        (y * k).sum().backward()
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1]), "gradients through the patched .cpu() are PyTorch's"
    assert torch.allclose(grads[0], 2 * w0 * k.cuda())
    w = w0.clone().requires_grad_()
    with torch.no_grad():
        same(w.cpu(), orig_cpu(w), "no_grad")  # not tracked: fast, requires_grad False
    with torch.inference_mode():
        got, want = t.cpu(), orig_cpu(t)
        assert got.is_inference() == want.is_inference()
        same(got, want, "inference_mode")
    print(f"fast .cpu(): {'on' if fast else 'off (control)'}; host side {host_kind}")


def torch_unified():
    """UMP_ALLOC_TORCH_UNIFIED=1 (RFC-0023): .to("cuda") of a CPU tensor on ump-alloc's pinned host
    side and .to("cpu") of a CUDA tensor on host-readable ump memory return the same memory;
    copy=True copies; writes show on both sides. The control (variable unset) copies."""
    import torch

    import ump_alloc

    unified = os.environ.get("UMP_ALLOC_TORCH_UNIFIED") == "1"
    ump_alloc.enable(cupy=False, torch=True)
    rng = np.random.default_rng(int.from_bytes(os.urandom(2), "little"))
    a = rng.random(1 << 20, dtype=np.float32)
    h = torch.from_numpy(a)
    torch.zeros(1, device="cuda")  # the first use of the GPU pins NumPy's memory
    if not ump_alloc.identify(h).device_accessible:
        print("host side not reachable by the GPU in this mode: nothing to alias")
        return
    c = h.to("cuda")
    assert c.is_cuda and torch.equal(c.cpu(), h)
    assert (c.data_ptr() == h.data_ptr()) == unified
    c.mul_(2.0)
    torch.cuda.synchronize()
    if unified:
        assert torch.equal(h, c.cpu()), "a GPU write must show in the CPU tensor"
    cc = h.to("cuda", copy=True)
    assert cc.data_ptr() != h.data_ptr()
    g = torch.randn(1 << 20, device="cuda")
    back = g.to("cpu")
    same = back.data_ptr() == g.data_ptr()
    assert same == (unified and ump_alloc.identify(g).host_accessible)
    assert torch.equal(back, g.to("cpu", copy=True))
    if same:
        g.add_(1.0)
        torch.cuda.synchronize()
        assert torch.equal(back, g.to("cpu", copy=True)), "the CPU view follows GPU writes"
    r = torch.randn(1 << 20, device="cuda", requires_grad=True)
    assert r.to("cpu").data_ptr() != r.data_ptr(), "autograd-tracked tensors copy"
    rc = r.to("cpu")
    (rc * 2).sum().backward()
    assert torch.equal(r.grad, torch.full_like(r, 2.0)), "gradients flow back through the copy"
    # CPU writes show on the GPU side, and GPU writes on the CPU side, only when unified.
    h2 = torch.from_numpy(rng.random(1 << 20, dtype=np.float32))
    c2 = h2.to("cuda")
    h2[:1000] = 5.0
    assert bool((c2[:1000] == 5.0).all()) == unified, "a CPU write through the source"
    if same:
        back[:1000] = -7.0
        assert bool((g[:1000] == -7.0).all()), "a CPU write through the view must show on the GPU"
    # bfloat16 has no array-interface type: copies.
    hb = torch.from_numpy(rng.random(1 << 20, dtype=np.float32)).to(torch.bfloat16)
    assert hb.to("cuda").data_ptr() != hb.data_ptr()
    # Lifetime: the CUDA view keeps the NumPy memory alive after every CPU reference is gone.
    a3 = rng.random(1 << 20, dtype=np.float32)
    want = a3.copy()
    c3 = torch.from_numpy(a3).to("cuda")
    del a3
    import gc

    gc.collect()
    _poison_host(want.nbytes)
    assert np.array_equal(c3.cpu().numpy(), want), "the view's memory was reused while it lived"
    print(f"unified: {'on' if unified else 'off (control)'}")


def cupy_zero_copy():
    """UMP_ALLOC_CUPY_ZERO_COPY=1: cupy.asnumpy / get of ump-alloc memory are views after the
    stream sync, cupy.asarray of ump-alloc NumPy memory is a view; writes show on both sides.
    The control (unset) copies."""
    import cupy as cp

    import ump_alloc

    on = os.environ.get("UMP_ALLOC_CUPY_ZERO_COPY") == "1"
    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(int.from_bytes(os.urandom(2), "little"))
    h = rng.random(1 << 20)
    x = cp.asarray(h)
    view_in = ump_alloc.is_zero_copy(x, h)
    assert view_in == (on and ump_alloc.identify(h).device_accessible), view_in
    y = cp.full(1 << 20, -1.0)  # poisoned, then written by a kernel
    y[...] = x * 2 + 1
    want_y = h * 2 + 1  # h may change below: with a view, x *= 3 writes through to it
    for got in (cp.asnumpy(y), y.get()):
        assert np.array_equal(got, want_y)
    v = cp.asnumpy(y)
    host_view = ump_alloc.is_zero_copy(v, y)
    assert host_view == (on and ump_alloc.identify(y).host_accessible), host_view
    if view_in:
        x *= 3
        cp.cuda.get_current_stream().synchronize()
        assert np.array_equal(h, cp.asnumpy(x)), "a GPU write through the view must show in NumPy"
    # Stream order: a kernel queued behind a 30 ms spin on a side stream; get() inside the
    # stream's context must wait for it (a view read too early shows the poison).
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        z = cp.full(1 << 20, -7.0)  # poisoned
        _spin(s, 30)
        z[...] = x * 5
        got = z.get()
    assert np.array_equal(got, cp.asnumpy(x) * 5), "get() returned before the stream's work was done"
    assert ump_alloc.is_zero_copy(got, z) == host_view
    # get(stream=...) from outside the stream's context waits for that stream too.
    with s:
        _spin(s, 30)
        z[...] = x * 6
    got = z.get(stream=s)
    assert np.array_equal(got, cp.asnumpy(x) * 6)
    # out= always copies into the caller's array.
    out = np.full(1 << 20, np.nan)
    r = y.get(out=out)
    assert r is out, "get(out=) must return out"
    assert np.array_equal(out, want_y), "get(out=) did not copy y"
    assert not ump_alloc.is_zero_copy(out, y)
    # NumPy memory that is not ump-alloc's, or a dtype change: a copy either way.
    foreign = np.frombuffer(bytearray(h.tobytes()), dtype=np.float64)
    assert not ump_alloc.identify(foreign).ours
    fx = cp.asarray(foreign)
    assert not ump_alloc.is_zero_copy(fx, foreign) and np.array_equal(cp.asnumpy(fx), h)
    cx = cp.asarray(h, dtype=cp.float32)
    assert not ump_alloc.is_zero_copy(cx, h) and np.allclose(cp.asnumpy(cx), h.astype(np.float32))
    # Aliasing of a host view: a later kernel write shows in the earlier view once synchronised.
    if host_view:
        y += 1
        cp.cuda.get_current_stream().synchronize()
        assert np.array_equal(v, want_y + 1), "the host view must alias the GPU array"
    else:
        y += 1
        cp.cuda.get_current_stream().synchronize()
        assert np.array_equal(v, want_y), "a copy must not change"
    print(f"cupy zero-copy: {'on' if on else 'off (control)'}; in {view_in}, out {host_view}")


def memory_summary_streams():
    """memory_summary() and pool_stats() on the GPU: one row per stream pool with what it holds
    (a freed 64 MiB block cached on a side stream, a live 32 MiB block on the default stream),
    and no row for a stream that never allocated (the control). On the ``swap`` route, where
    ump-alloc keeps a pool per stream; on the default ``segments`` route PyTorch's own caching
    allocator orders the streams and ump-alloc sees only its segments."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True, torch_route="swap")
    MB = 2**20
    side, idle = torch.cuda.Stream(), torch.cuda.Stream()
    keep = torch.empty(32 * MB, dtype=torch.uint8, device="cuda").fill_(7)
    with torch.cuda.stream(side):
        gone = torch.empty(64 * MB, dtype=torch.uint8, device="cuda").fill_(1)
        del gone
    torch.cuda.synchronize()
    pools = {p["stream"]: p for p in ump_alloc.pool_stats() if p["device"] == 0}
    assert side.cuda_stream in pools and 0 in pools, pools
    assert idle.cuda_stream not in pools, "a stream that never allocated has no pool"
    s = pools[side.cuda_stream]
    assert s["cached"] >= 64 * MB and s["largest_free"] >= 64 * MB and not s["retired"], s
    d = pools[0]
    assert d["mapped"] - d["cached"] >= 32 * MB, d
    text = ump_alloc.memory_summary()
    print(text)
    assert f"stream {side.cuda_stream:#x}" in text and "stream legacy default" in text
    assert f"stream {idle.cuda_stream:#x}" not in text
    assert "device 0 (" in text and "device side: nothing allocated" not in text
    assert ", 0 errors" in text, "walking the pool list is not an error"
    assert int(keep[::MB].sum()) == 7 * 32


def _dask_cupy_blocks(client):
    import cupy as cp
    import dask.array as da

    import ump_alloc

    def make(block_info=None):
        import cupy as cp

        i, j = block_info[None]["chunk-location"]
        return cp.random.default_rng(100 * i + j + 1).random((512, 512))

    x = da.map_blocks(make, chunks=((512,) * 4, (512,) * 4), dtype=np.float64, meta=cp.empty((0, 0)))
    y = (x * 2.0 + 1.0) @ x.T  # arrays made inside the tasks, and a GPU matmul
    flags = y.map_blocks(
        lambda b: np.full((1, 1), isinstance(b, cp.ndarray) and ump_alloc.identify(b).ours),
        chunks=(1, 1),
        dtype=bool,
        meta=np.empty((0, 0), dtype=bool),
    )
    got = np.asarray(client.compute(flags).result())
    total = float(client.compute(y.sum()).result())
    rows = [cp.concatenate([cp.random.default_rng(100 * i + j + 1).random((512, 512)) for j in range(4)], axis=1) for i in range(4)]
    xs = cp.concatenate(rows, axis=0)
    want = float(((xs * 2.0 + 1.0) @ xs.T).sum())
    return got, total, want


def dask_cupy():
    """ump_alloc.dask with CuPy-backed dask arrays on a LocalCluster of 2 worker processes: with
    the worker plugin, every task's CuPy block is an ump-alloc block and the result equals the
    same computation in this process; control: without the plugin, none is."""
    from distributed import Client, LocalCluster

    import ump_alloc.dask as ud

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        with Client(c) as client:
            got, total, want = _dask_cupy_blocks(client)
            assert not got.any(), "control: without the plugin no CuPy block should be ump-alloc's"
            assert np.isclose(total, want, rtol=1e-9), (total, want)
            client.register_plugin(ud.UmpWorkerPlugin(cupy=True, torch=False))
            got, total, want = _dask_cupy_blocks(client)
            assert got.all(), f"{int((~got).sum())} of {got.size} CuPy task blocks were not ump-alloc's"
            assert np.isclose(total, want, rtol=1e-9), (total, want)
            import time

            deadline = time.time() + 20
            while time.time() < deadline:
                ms = [w["metrics"] for w in client.scheduler_info()["workers"].values()]
                if all(m.get("ump_alloc_device_mapped", 0) > 0 for m in ms):
                    break
                time.sleep(0.5)
            assert all(m.get("ump_alloc_device_mapped", 0) > 0 for m in ms), ms
    print(f"dask+cupy: 16 blocks per run on 2 workers, all ump-alloc's; sum {total:.6g}")


def public_cupy_allocator():
    """ump_alloc.allocators.cupy.ump_cupy_allocator set by hand (no enable()): CuPy arrays are
    ump-alloc blocks with right kernel results; control: CuPy's own pool before it."""
    import cupy as cp

    import ump_alloc
    from ump_alloc.allocators.cupy import ump_cupy_allocator

    rng = np.random.default_rng(int.from_bytes(os.urandom(2), "little"))
    h = rng.random(1 << 20)
    before = cp.asarray(h)
    assert not ump_alloc.identify(before).ours, "control: CuPy's pool is not ump-alloc's"
    cp.cuda.set_allocator(ump_cupy_allocator)
    x = cp.asarray(h)
    y = cp.full(x.shape, np.nan)
    y[...] = x * 3 - 1
    assert ump_alloc.identify(y).ours and ump_alloc.identify(x).ours
    assert np.array_equal(cp.asnumpy(y), h * 3 - 1)
    assert not ump_alloc.is_enabled(), "setting the allocator by hand must not switch NumPy over"
    print(f"public CuPy allocator: {ump_cupy_allocator!r}")


def public_torch_allocator():
    """ump_alloc.allocators.torch: change_current_allocator(ump_torch_allocator) + attach():
    tensors are ump-alloc blocks, right results, and a too-large tensor raises
    torch.OutOfMemoryError (attached) under UMP_ALLOC_LIMIT."""
    import torch

    import ump_alloc
    from ump_alloc.allocators.torch import attach, ump_torch_allocator

    torch.cuda.memory.change_current_allocator(ump_torch_allocator)
    attach()
    a = torch.rand(1 << 20, device="cuda")
    b = torch.full_like(a, float("nan"))
    b.copy_(a * 3 - 1)
    assert ump_alloc.identify(b).ours and ump_alloc.identify(a).ours
    assert torch.equal(b.cpu(), a.cpu() * 3 - 1)
    try:
        torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        print(f"OOM: {str(e)[:80]}")
    else:
        raise AssertionError("a 1 TiB tensor did not raise torch.OutOfMemoryError")
    print("public torch allocator: ok")


# ---- issue 12: the virtual-memory device pool --------------------------------------------------


def _dev_stats():
    import ump_alloc

    return ump_alloc.stats()["devices"][0]


def vmm_device_pool():
    """Device side 'device' as a virtual-memory pool: a 4 KiB CuPy array holds one 2 MiB page,
    not a 64 MiB arena (the control, UMP_ALLOC_DEVICE_VMM=0, maps the arena); blocks of random
    sizes filled by kernels with random data keep their contents and addresses while others
    are freed, purged and mapped again; trim gives every free page back."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    vmm = os.environ.get("UMP_ALLOC_DEVICE_VMM", "1") == "1"
    tiny = cp.empty(4096, cp.uint8)
    st = _dev_stats()
    mib = 1 << 20
    if vmm:
        assert st["mapped"] == 2 * mib, st
        assert st["reserved"] >= 1 << 30, st
    else:
        assert st["mapped"] == 64 * mib and st["reserved"] >= st["mapped"], st
        print(f"control (chunks): a 4 KiB array maps {st['mapped'] // mib} MiB")
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    live = {}
    for round_ in range(4):
        for _ in range(60):
            n = int(np.exp(rng.uniform(np.log(256), np.log(300 * mib)))) // 4
            x = cp.random.randint(0, 2**31, size=n, dtype=cp.int32)
            live[x.data.ptr] = (x, cp.asnumpy(x))
        keys = list(live)
        rng.shuffle(keys)
        for k in keys[: len(keys) // 2]:
            del live[k]
        if round_ == 2:
            ump_alloc.trim()
        for ptr, (x, h) in live.items():
            assert x.data.ptr == ptr
            assert np.array_equal(cp.asnumpy(x), h), "a live block changed while others were purged"
    st = _dev_stats()
    assert st["mapped"] <= st["reserved"] or not vmm, st
    print(f"{len(live)} live blocks: in use {st['in_use'] // mib} MiB, mapped {st['mapped'] // mib} MiB, "
          f"reserved {st['reserved'] // mib} MiB, largest free {st['largest_free'] // mib} MiB, "
          f"fragmentation {st['fragmentation']:.2f}")
    live.clear()
    del x, tiny
    ump_alloc.trim()
    st = _dev_stats()
    assert st["in_use"] == 0 and st["mapped"] == 0, st


def vmm_purge_waits_for_queued_work():
    """A block freed while a queued kernel still reads it (behind a 1 s spin on its stream),
    then a larger block whose commit would take mapped memory far past the peak: the pool
    purges the freed block's pages to make room, but only after the kernel that reads them is
    done (it waits for the fence). Had the pages gone early, the kernel would fault (illegal
    address) or read garbage into z; had the pool not purged them, mapped would have grown by
    the whole new block."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    mib = 1 << 20
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.random.standard_normal(64 * mib, dtype=cp.float32)  # 256 MiB
        z = cp.full(x.size, np.nan, dtype=cp.float32)
        cp.multiply(x[:8], 2, out=z[:8])  # compiled now, not behind the spin
        _spin(s, 1)
        s.synchronize()
        hx = cp.asnumpy(x)
        t0 = time.perf_counter()
        _spin(s, 1000)
        cp.multiply(x, 2, out=z)  # queued behind the spin: reads x
        del x  # freed on s while the kernel that reads it waits
        before = _dev_stats()
        y = cp.empty(512 * mib, cp.uint8)  # past the peak: wants x's pages
        waited = time.perf_counter() - t0
        mid = _dev_stats()
    s.synchronize()
    out = cp.asnumpy(z)
    assert not np.isnan(out).any() and np.array_equal(out, hx * 2), "the kernel read purged memory"
    assert mid["mapped"] <= before["mapped"] + 256 * mib + 8 * mib, (before, mid)
    print(f"mapped: {before['mapped'] // mib} MiB after the free, {mid['mapped'] // mib} MiB with the new "
          f"512 MiB block (in use {mid['in_use'] // mib} MiB); the allocation waited {waited:.2f} s for the kernel")
    del y, z


def vmm_idle_pages_go_back():
    """After a big phase (4 GiB of blocks of many sizes made and freed), a small phase that keeps
    allocating for 2 s brings mapped memory back near what it uses, with no trim."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    mib = 1 << 20
    rng = np.random.default_rng(3)
    big = [cp.empty(int(rng.integers(16, 400)) * mib, cp.uint8) for _ in range(20)]
    for b in big:
        b.fill(7)
    peak = _dev_stats()["mapped"]
    del big, b
    assert _dev_stats()["mapped"] >= peak - 64 * mib, "freed blocks keep their pages until the purge delay"
    t0 = time.time()
    keep = []
    while time.time() - t0 < 2.0:
        keep.append(cp.ones(int(rng.integers(1, 8)) * mib // 4, cp.float32))
        if len(keep) > 8:
            keep.pop(0)
        time.sleep(0.01)
    st = _dev_stats()
    assert st["mapped"] <= st["in_use"] + 96 * mib, st
    print(f"mapped {peak // mib} MiB at the big phase, {st['mapped'] // mib} MiB after 2 s of small blocks "
          f"(in use {st['in_use'] // mib} MiB), no trim")


def numpy_realloc_in_place():
    """ndarray.resize of a large NumPy array on the host side (pinned: the chunk grows into its
    reserved room and is registered again; plain host memory: mremap) copies nothing, and
    every byte of the grown array is reachable by the GPU: a kernel reads the whole array in
    place and a DMA copy (cupy.asarray) moves all of it, spanning old and new pages. A copy
    across two separate registrations fails (measured: CUDA_ERROR_INVALID_VALUE), so a grown
    chunk registered in two pieces would fail here."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    _first_gpu_use()  # pinned from the start: the growth re-registers the chunk
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    a = rng.standard_normal(16 << 20).astype(np.float32)  # 64 MiB: more than an arena, so a chunk of its own
    before = ump_alloc.stats()["realloc"]
    n = a.size
    for step in range(1, 6):
        m = n + (n >> 1) + step * 12345
        a.resize(m, refcheck=False)
        a[n:] = rng.standard_normal(m - n).astype(np.float32)
        n = m
        ident = ump_alloc.identify(a)
        assert ident.ours and ident.device_accessible, ident
        st = ump_alloc.stats()["realloc"]
        assert st["copied_bytes"] == before["copied_bytes"], (step, st, ump_alloc.last_error())
        total = float(cp.sum(_cupy_view(a), dtype=cp.float64).get())  # a kernel reads it in place
        assert abs(total - float(a.sum(dtype=np.float64))) <= 1e-6 * float(np.abs(a).sum()) + 1e-3
        g = cp.full(a.size, np.nan, dtype=cp.float32)
        g.set(a)  # one DMA copy of the whole array
        assert np.array_equal(cp.asnumpy(g), a)
    after = ump_alloc.stats()["realloc"]
    assert after["copied_bytes"] == before["copied_bytes"], (before, after)
    assert after["in_place"] >= before["in_place"] + 5, (before, after)
    print(f"{ump_alloc.identify(a).kind}: grew to {a.nbytes >> 20} MiB in 5 steps with no copy: {after}")


# ---- issue 12: managed-memory residency --------------------------------------------------------


def managed_residency():
    """Device side managed: asnumpy of a large GPU-written array returns at once while its pages
    migrate in the background, and the host reads every element right; a block freed while
    that migration may still run, then reused at once by a kernel that writes poisoned memory,
    holds exactly what the kernel wrote. With UMP_ALLOC_MANAGED_DISCARD=1 (the default) the
    freed blocks the host read are discarded and their reuse discarded-and-prefetched (the
    counter grows); with 0 (the control) nothing is discarded and the data is just as right."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    on = os.environ.get("UMP_ALLOC_MANAGED_DISCARD", "1") == "1"
    mib = 1 << 20
    cp.ones(1)  # the device's pools exist from here on
    d0 = _dev_stats()["discarded"]
    rng_seed = int.from_bytes(os.urandom(4), "little")
    for it in range(12):
        n = (64 + 32 * (it % 3)) * mib // 4
        x = _rand_u32(cp, n, rng_seed + it)
        ref = cp.asnumpy(x)  # a DMA copy: the expected values
        h = ump_alloc.asnumpy(x, copy=False)
        assert isinstance(h.base, ump_alloc.ZeroCopyBuffer), "a view, not a copy"
        if it % 2:
            del h, x  # freed while the background migration may still run
        else:
            assert np.array_equal(h, ref), "the host read what the kernel wrote"
            del h, x
        y = cp.full(n, 0xDEADBEEF, dtype=cp.uint32)  # reuses the block: discard+prefetch
        y[...] = _rand_u32(cp, n, rng_seed + 1000 + it)
        want = cp.asnumpy(_rand_u32(cp, n, rng_seed + 1000 + it))
        assert np.array_equal(cp.asnumpy(y), want), "the reused block holds what the kernel wrote"
        del y
        print(f"round {it}: {n * 4 >> 20} MiB, discarded so far {(_dev_stats()['discarded'] - d0) >> 20} MiB"
              f" ({ump_alloc.last_error()})")
    cp.cuda.Device().synchronize()
    d1 = _dev_stats()["discarded"]
    if on:
        assert d1 - d0 >= 6 * 64 * mib, (d0, d1)
    else:
        assert d1 == d0, (d0, d1)
    print(f"managed discard {'on' if on else 'off (control)'}: {(d1 - d0) >> 20} MiB discarded over 12 rounds")


# ---- issue 22: explicit transfers pick the faster of a view and a DMA copy ---------------------

# The plan each mode's memory must get, for a reader of all of it and for one of a hundredth:
# (asnumpy of a CuPy/torch array, asarray of a NumPy array). Device side managed (pinned,
# managed): GPU-written, read whole by the host -> DMA copy into pinned memory; sparse -> view.
# Host side pinned (pinned, registered): read whole by kernels -> DMA copy; sparse -> view.
# Host side managed (managed): a stream-ordered prefetch, a view either way. Device side pinned
# (registered): the host reads host memory, a view. Device side device: only copies; NumPy's
# memory there is pageable, which this GPU cannot read without HMM/ATS: only copies too.
_TRANSFER_EXPECT = {
    "pinned": {"host": ("copy", "view"), "device": ("copy", "view")},
    "managed": {"host": ("copy", "view"), "device": ("view", "view")},
    "registered": {"host": ("view", "view"), "device": ("copy", "view")},
    "device": {"host": ("copy", "copy"), "device": ("copy", "copy")},
    "system": {"host": ("view", "view"), "device": ("view", "view")},
}


def _transfer_expect(ump_alloc, to, touch):
    exp = _TRANSFER_EXPECT[ump_alloc.mode()][to]
    return exp[0] if touch is None else exp[1]


def _check_asnumpy_outcomes(ump_alloc, make, first_on_gpu, sync_all):
    """asnumpy in the four ways (default, sparse hint, copy=True, copy=False) of a GPU array
    written behind a slow kernel on a non-default stream, with a poisoned host destination:
    the plan's path is taken, the result holds exactly what the kernel wrote, a copy is
    independent of the source and a view is not."""
    import gc

    seed0 = int.from_bytes(os.urandom(3), "little")
    for k, (touch, copy) in enumerate(((None, None), (0.01, None), (None, True), (None, False))):
        seed = seed0 + k
        x, s, n = make(seed)  # written on stream s behind a ~20 ms kernel; poisoned before
        _poison_host(n * 4)
        plan = ump_alloc.transfer_plan(x, touch=touch)
        want = plan.path if copy is None else ("copy" if copy else "view")
        if copy is None:
            assert plan.path == _transfer_expect(ump_alloc, "host", touch), (ump_alloc.mode(), touch, plan)
        if copy is False and not plan.view_possible:
            try:
                ump_alloc.asnumpy(x, stream=s, copy=False)
                raise AssertionError("copy=False where the host cannot read the memory must raise")
            except ValueError as e:
                assert "copy=False" in str(e) and "copy=None" in str(e), e
            sync_all()
            continue
        h = ump_alloc.asnumpy(x, stream=s, copy=copy, touch=touch)
        got = "view" if isinstance(h.base, ump_alloc.ZeroCopyBuffer) else "copy"
        assert got == want, (ump_alloc.mode(), touch, copy, got, plan)
        assert ump_alloc.is_zero_copy(h, x) == (got == "view"), "is_zero_copy must tell which it was"
        assert not np.isnan(h).any(), f"{got}: saw the poison (not ordered after the stream's work)"
        np.testing.assert_array_equal(h, _host_hash(n, seed))
        if got == "copy":
            assert h.base is None and h.flags.owndata
            assert ump_alloc.identify(h).ours, "the copy's destination is ump-alloc's host side"
        h[0] = -7.0  # through the result: reaches the source only for a view
        sync_all()
        assert (first_on_gpu(x) == -7.0) == (got == "view"), got
        # Lifetime: the source may go; a view keeps it alive through .base (a new array of the
        # same size would otherwise get its block and overwrite it), a copy owns its data.
        del x
        gc.collect()
        reuse, _, _ = make(seed + 1000)
        sync_all()
        assert h[0] == -7.0 and not np.isnan(h).any()
        np.testing.assert_array_equal(h[1:], _host_hash(n, seed)[1:])
        del reuse
        print(f"asnumpy touch={touch} copy={copy}: {got} ({plan.reason})")


def _check_asarray_outcomes(ump_alloc, like, n, spin, s, double_on_s, seed0):
    """asarray in the four ways of a NumPy array on ump-alloc's host side, with the stream busy
    for ~20 ms: the plan's path is taken, and a host write made after the call (NaN) reaches a
    view's kernels but never a copy's."""
    for k, (touch, copy) in enumerate(((None, None), (0.01, None), (None, True), (None, False))):
        expect = _host_hash(n, seed0 + k)
        a = np.empty(n, np.float32)
        a[:] = expect
        plan = ump_alloc.transfer_plan(a, touch=touch)
        if copy is None:
            assert plan.path == _transfer_expect(ump_alloc, "device", touch), (ump_alloc.mode(), touch, plan)
        if copy is False and not plan.view_possible:
            try:
                ump_alloc.asarray(a, like=like, stream=s, copy=False)
                raise AssertionError("copy=False where the GPU cannot read the memory must raise")
            except ValueError as e:
                assert "no HMM/ATS" in str(e) and "copy=None" in str(e), e
            continue
        spin(20)
        g = ump_alloc.asarray(a, like=like, stream=s, copy=copy, touch=touch)
        got = "view" if ump_alloc.is_zero_copy(a, g) else "copy"
        assert got == (plan.path if copy is None else ("copy" if copy else "view")), (ump_alloc.mode(), touch, copy, got)
        a[:] = np.nan  # a host write after the call: reaches a view, never a copy
        back = double_on_s(g)
        if got == "copy":
            np.testing.assert_array_equal(back, expect * 2)
        else:
            assert np.isnan(back).all(), "a view reads the host's latest writes"
        print(f"asarray({like}) touch={touch} copy={copy}: {got} ({plan.reason})")


def transfer_choice_cupy():
    """Issue 22, CuPy: asnumpy and asarray take the transfer plan's path by default (a view or a
    stream-ordered DMA copy, as _TRANSFER_EXPECT says for this mode), copy= forces one, and both
    keep the guarantees: ordered after the stream's work (poisoned outputs, a slow kernel ahead),
    lifetime, is_zero_copy telling the truth, a copy independent of its source. Controls: a
    copy on another stream sees the poison, and CuPy's own non-blocking copy of pinned memory
    sees a host write made after it returned; neither happens on ump-alloc's paths."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    fill = cp.ElementwiseKernel("uint32 seed", "float32 y", _HASH, "ump_hash")
    s = cp.cuda.Stream(non_blocking=True)
    n = 48 * 2**20 // 4 + 17

    def make(seed):
        with s:
            x = cp.empty(n, cp.float32)
            x.fill(cp.nan)
        s.synchronize()
        _spin(s, 20)
        with s:
            fill(np.uint32(seed), x)
        return x, s, n

    _check_asnumpy_outcomes(ump_alloc, make, lambda x: float(x[0].get(stream=s)), cp.cuda.Device().synchronize)
    # Control (D2H): a copy queued on another stream is not ordered after s's work.
    other = cp.cuda.Stream(non_blocking=True)
    x, _, _ = make(99)
    bad = np.empty(n, np.float32)
    x.get(stream=other, out=bad)
    cp.cuda.Device().synchronize()
    assert np.isnan(bad).any(), "control: a copy on another stream should have seen the poison"
    print("control: a copy not ordered after the stream's work sees the poison: ok")

    # H2D: a NumPy array on ump-alloc's host side, read by a kernel queued on s after the call.
    def double_on_s(g):
        with s:
            out = g * 2
        return cp.asnumpy(out, stream=s)

    _check_asarray_outcomes(ump_alloc, "cupy", n, lambda ms: _spin(s, ms), s, double_on_s, 500)
    # Control (H2D): CuPy's own non-blocking copy of pinned memory, queued behind a slow kernel,
    # reads a host write made after it returned: the race ump-alloc's copy closes by waiting.
    # Only where CuPy's array is GPU memory: in mode registered it is pinned host memory too, and
    # the driver does a host-to-host copy at once (seen on the H100), so there is no race to show.
    if (
        ump_alloc.identify(np.empty(n, np.float32)).kind == "registered"
        and ump_alloc.identify(cp.empty(16, cp.float32)).kind != "registered"
    ):
        a = np.empty(n, np.float32)
        a[:] = 1.0
        _spin(s, 30)
        with s:
            g = cp.asarray(a, blocking=False)
        a[:] = np.nan
        assert np.isnan(cp.asnumpy(g, stream=s)).any(), "control: CuPy's non-blocking copy should see the write"
        print("control: a copy that does not wait sees a later host write: ok")


def transfer_choice_torch():
    """Issue 22, PyTorch: as transfer_choice_cupy for torch tensors, including a tensor that
    starts inside a larger block (PyTorch's caching allocator sub-allocates ump-alloc's blocks
    when it sits on top, issue 19): ump_identify resolves its interior pointer."""
    import torch

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=True)
    s = torch.cuda.Stream()
    n = 48 * 2**20 // 4 + 17
    offset = 4096 + 3  # elements: the tensor starts inside its block

    def make(seed):
        with torch.cuda.stream(s):
            big = torch.full((n + 2 * offset,), float("nan"), device="cuda")
        s.synchronize()
        x = big[offset : offset + n]
        with torch.cuda.stream(s):  # everything on s: src is freed in s's order, after the copy
            src = torch.from_numpy(_host_hash(n, seed)).cuda()
            torch.cuda._sleep(int(20 * 1.5e6))  # the copy below lands ~20 ms later
            x.copy_(src)
        return x, s, n

    _check_asnumpy_outcomes(ump_alloc, make, lambda x: float(x[0].cpu()), torch.cuda.synchronize)

    def double_on_s(t):
        with torch.cuda.stream(s):
            return (t * 2).cpu().numpy()

    _check_asarray_outcomes(ump_alloc, "torch", n, lambda ms: _spin_torch(s, ms), s, double_on_s, 700)


def _spin_torch(stream, ms):
    """Keep a torch stream busy for about `ms` milliseconds (torch.cuda._sleep counts cycles)."""
    import torch

    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(ms * 1.5e6))


def numpy_thread_made_before_enable():
    """Issue 23: a thread that exists before ump-alloc is enabled (a pool worker) allocates its
    NumPy arrays from ump-alloc afterwards (NumPy's default handler dispatches), so a GPU
    kernel reads and writes them in place. The control: the same worker's array from before
    enable() is NumPy's pageable memory, which the GPU cannot reach without HMM."""
    import concurrent.futures

    import cupy as cp

    import ump_alloc

    seed = int.from_bytes(os.urandom(4), "little")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before = pool.submit(lambda: np.random.default_rng(seed).standard_normal(1 << 20).astype(np.float32)).result()
        ib = ump_alloc.identify(before)
        assert not ib.ours, ib
        ump_alloc.enable(torch=False)

        def make(s):
            x = np.random.default_rng(s).standard_normal(3_000_001).astype(np.float32)
            out = np.full_like(x, np.nan)  # poisoned: the kernel must write every element
            return x, out, ump_alloc.is_enabled()

        x, out, on = pool.submit(make, seed + 1).result()
        assert on, "the worker made before enable() is not on ump-alloc"
        _first_gpu_use()  # pins them (UMP_ALLOC_PIN=lazy): the kernel below is handed raw pointers
        for a in (x, out):
            ident = ump_alloc.identify(a)
            assert ident.ours and ident.device_accessible and ident.base == a.ctypes.data, ident
        cp.ElementwiseKernel("float32 a", "float32 y", "y = a * 2 + 1", "ump_t23")(_cupy_view(x), _cupy_view(out))
        cp.cuda.get_current_stream().synchronize()
        assert not np.isnan(out).any(), "the kernel did not write the worker's array"
        np.testing.assert_allclose(out, x * 2 + 1, rtol=1e-6, atol=1e-6)
        del x, out
        errors = ump_alloc.error_count()
        ump_alloc.disable()
    assert ump_alloc.error_count() == errors, ump_alloc.last_error()
    print(f"worker made before enable(): {ib.kind} before, ours and device-accessible after ({ump_alloc.mode()})")


# ---- issue 20: fork() and the pinned host side ----------------------------------------------------


def _private_dirty_mib():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _child_report(w, fn):
    """In a fork child: run `fn`, send its repr() through `w`, leave (status 0 if it returned)."""
    code = 3
    try:
        os.write(w, repr(fn()).encode()[:4000])
        code = 0
    except BaseException as e:  # noqa: BLE001 - reported to the parent
        os.write(w, f"error {type(e).__name__}: {e}".encode()[:4000])
    finally:
        os._exit(code)


def _read_all(r):
    out = b""
    while True:
        b = os.read(r, 65536)
        if not b:
            return out.decode()
        out += b


def fork_pinned_pages():
    """A fork child of a process holding 1 GiB of pinned NumPy arrays (CUDA in use): with
    UMP_ALLOC_PINNED_FORK=share (the default) it starts with almost no memory of its own, reads
    the arrays right, and its writes stay its own; with =copy (the control) fork copies the whole
    gibibyte into it, as before issue 20."""
    import cupy as cp

    import ump_alloc

    share = os.environ.get("UMP_ALLOC_PINNED_FORK", "share") == "share"
    ump_alloc.enable(torch=False)
    caps = ump_alloc.capabilities()
    assert caps["fork_shared"] == share, caps["fork_rule"]
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    big = rng.integers(0, 2**63, 2**30 // 8, dtype=np.int64)          # 1 GiB, one chunk
    small = [rng.random(n) for n in (3, 1000, 30_000, 200_000)]     # slabs and an arena
    assert ump_alloc.identify(big).kind == "registered"
    want = int(big.sum(dtype=np.uint64)), [float(s.sum()) for s in small]
    g = ump_alloc.asarray(big, like="cupy")                         # the GPU reads it in place
    assert int(cp.sum(g, dtype=cp.uint64).get()) == want[0]
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        def child():
            dirty0 = _private_dirty_mib()
            ok = int(big.sum(dtype=np.uint64)) == want[0] and [float(s.sum()) for s in small] == want[1]
            dirty1 = _private_dirty_mib()
            big[::4096] = -1                                        # one word per 32 KiB
            small[1][:] = -1
            return ok, round(dirty0), round(dirty1), round(_private_dirty_mib())
        _child_report(w, child)
    fork_ms = (time.perf_counter() - t0) * 1e3
    os.close(w)
    got = _read_all(r)
    _, status = os.waitpid(pid, 0)
    print(f"UMP_ALLOC_PINNED_FORK={'share' if share else 'copy'}: fork {fork_ms:.1f} ms; child "
          f"(read right, Private_Dirty MiB after fork / after reading / after writing): {got}")
    assert status == 0, got
    ok, dirty_fork, dirty_read, dirty_write = eval(got)  # noqa: S307 - our own repr of a tuple
    assert ok, "the child read wrong data"
    if share:
        assert dirty_fork < 256 and dirty_read < 256, "fork copied the pinned pages"
        assert dirty_write >= 100, "the child's writes were not its own pages"
    else:
        assert dirty_fork >= 900, "control: fork copies every pinned page (issue 20's measurement)"
    assert int(big.sum(dtype=np.uint64)) == want[0] and float(small[1].sum()) == want[1][1], \
        "the child's writes reached the parent"
    assert int(cp.sum(g, dtype=cp.uint64).get()) == want[0], "the GPU still reads the parent's pages"


def fork_holds_freed_blocks():
    """A child reads arrays the parent frees and replaces meanwhile: the child's view stays
    right (the freed blocks are held back, not reused, and counted in stats()['fork_held']), and
    once the child is gone they go back and are reused. Control: the parent's in-place writes to
    an array made before the fork show in the child (UMP_ALLOC_PINNED_FORK=share), so reusing a
    freed block would corrupt the child's view; with =copy they do not."""
    import cupy as cp

    import ump_alloc

    share = os.environ.get("UMP_ALLOC_PINNED_FORK", "share") == "share"
    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    keep = rng.random(2**20)                                    # lives on: the in-place control
    freed = [rng.random(n) for n in (64 * 2**20 // 8, 3 * 2**20, 4096, 100, 100, 7)]
    sums = [float(a.sum()) for a in freed]
    addrs = [a.ctypes.data for a in freed]
    cp.asarray(keep).sum()                                      # CUDA in use in the parent
    go_r, go_w = os.pipe()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        def child():
            os.read(go_r, 1)
            return [float(a.sum()) for a in freed], float(keep[12345])
        _child_report(w, child)
    os.close(w)
    os.close(go_r)
    del freed
    held = ump_alloc.stats()["fork_held"]
    new = [np.full(n, 7.0) for n in (64 * 2**20 // 8, 3 * 2**20, 4096, 100, 100, 7)]
    reused = [a.ctypes.data in addrs for a in new]
    keep[12345] = -5.0                                          # in place, after the fork
    os.write(go_w, b"1")
    got = _read_all(r)
    _, status = os.waitpid(pid, 0)
    print(f"UMP_ALLOC_PINNED_FORK={'share' if share else 'copy'}: held while the child lived: {held}; "
          f"new arrays at old addresses: {reused}; child: {got}")
    assert status == 0, got
    child_sums, child_keep = eval(got)  # noqa: S307 - our own repr
    assert child_sums == sums, "the child's view of the freed arrays changed"
    if share:
        assert held["blocks"] >= 6 and held["bytes"] >= 88 * 2**20, held
        assert not any(reused), "a held block was reused while the child lived"
        assert child_keep == -5.0, "control: the parent's later in-place write shows in the child"
    else:
        assert held == {"bytes": 0, "blocks": 0}, held
        assert child_keep != -5.0, "control: copies do not see the parent's later writes"
    after = ump_alloc.stats()["fork_held"]
    assert after == {"bytes": 0, "blocks": 0}, f"still held after the child exited: {after}"
    if share:
        # `new` still lives: the only free 64 MiB chunk is the one given back.
        again = np.empty(64 * 2**20 // 8)
        print("after the child: held", after, "; the big block reused:", again.ctypes.data == addrs[0])
        assert again.ctypes.data == addrs[0], "the released block is reused"


def fork_children_leak_nothing():
    """Forty fork children (DataLoader-style, some forking again) read the parent's pinned arrays
    and exit; then nothing is held back, trim() gives every pinned byte back, and the shared
    memory file holds no memory."""
    import ump_alloc

    ump_alloc.enable(torch=False)

    def file_bytes():
        def target(f):
            try:
                return os.readlink(f"/proc/self/fd/{f}")
            except OSError:  # the descriptor listdir itself used, closed by now
                return ""

        fds = [f for f in os.listdir("/proc/self/fd") if "ump-alloc-pinned" in target(f)]
        return os.stat(f"/proc/self/fd/{fds[0]}").st_blocks * 512 if fds else 0

    # The generator first: its seed sequence keeps small NumPy arrays of its own alive (their
    # arena stayed pinned after the final trim on the H100 when it was made after the baseline).
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    ump_alloc.trim()
    pinned0, file0 = ump_alloc.stats()["pinned"]["bytes"], file_bytes()
    data = [rng.random(n) for n in (2**24, 2**20, 5000, 10)]
    sums = [float(a.sum()) for a in data]
    fds = len(os.listdir("/proc/self/fd"))
    pids = []
    for i in range(40):
        pid = os.fork()
        if pid == 0:
            ok = [float(a.sum()) for a in data] == sums
            if i % 5 == 0:                                     # a child that forks again
                p2 = os.fork()
                if p2 == 0:
                    os._exit(0 if [float(a.sum()) for a in data] == sums else 4)
                ok = ok and os.waitpid(p2, 0)[1] == 0
            x = np.ones(2**20)                                  # the child allocates too
            os._exit(0 if ok and x.sum() == 2**20 else 3)
        pids.append(pid)
        del data[-1]                                            # the parent frees while children run
        data.append(rng.random(10))
        sums[-1] = float(data[-1].sum())
    bad = [s for s in (os.waitpid(p, 0)[1] for p in pids) if s]
    assert not bad, bad
    assert len(os.listdir("/proc/self/fd")) == fds, "a child's lock left a descriptor in the parent"
    s = ump_alloc.stats()
    assert s["fork_held"] == {"bytes": 0, "blocks": 0}, s["fork_held"]
    del data
    mid = file_bytes()
    ump_alloc.trim()
    s = ump_alloc.stats()
    print(f"pinned {pinned0} and memory file {file0} bytes before; with the arrays: file {mid}; after 40 "
          f"children and trim: pinned {s['pinned']['bytes']}, held {s['fork_held']}, file {file_bytes()}")
    assert mid >= 136 * 2**20, "the arrays are in the memory file"
    # What the file still holds lies in the chunks still mapped (the generator's arena): the
    # 40 children's held blocks and the parent's arrays went back with their chunks.
    assert s["pinned"]["bytes"] <= pinned0 and file_bytes() <= max(file0, s["pinned"]["bytes"])


def plain_host_side_loads_no_cuda():
    """UMP_ALLOC_HOST_SIDE=host on the GPU machine: a NumPy program that allocates and forks starts
    no thread and does not load the CUDA driver (Python 3.12's fork warning, made an error here,
    stays quiet); asking for the mode loads it. Control (UMP_GPU_CONTROL=1, default sides with
    UMP_ALLOC_PIN=eager): the driver is loaded at enable()."""
    import warnings

    import ump_alloc

    def threads():
        return len(os.listdir("/proc/self/task"))

    def cuda_loaded():
        with open("/proc/self/maps") as f:
            return "libcuda.so" in f.read()

    control = os.environ.get("UMP_GPU_CONTROL") == "1"
    start = threads()
    ump_alloc.enable()
    a = np.random.default_rng(1).random(2**22)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        pid = os.fork()
        if pid == 0:
            os._exit(0 if a.sum() > 0 else 3)
    assert os.waitpid(pid, 0)[1] == 0
    fork_warnings = [str(w.message) for w in seen if "multi-threaded" in str(w.message)]
    print(f"threads {start} -> {threads()}, libcuda loaded: {cuda_loaded()}, fork warnings: {fork_warnings}, "
          f"control: {control}")
    if control:
        assert cuda_loaded(), "control: eager pinning loads the driver at enable()"
        return
    assert threads() == start and not cuda_loaded() and not fork_warnings, (start, threads())
    print("mode when asked:", ump_alloc.mode(), "| libcuda loaded now:", cuda_loaded())
    assert cuda_loaded()


# ---- issue 21: device-side realloc from the host -----------------------------------------------


def _realloc_race(lib, s, use_realloc):
    """Two 8 MiB managed blocks of stream `s`, y just below x. A kernel queued on `s` behind a
    1 s spin fills x with a marker, and x is freed at once (stream-ordered: `s` may reuse it).
    Then, from the host, either y is realloc'ed to 16 MiB (over x's memory: the check) or a new
    8 MiB block is taken on `s` (x's memory: the control), and the host writes a random pattern
    over what it got, then waits for `s`. Returns (what the host wrote, what the memory holds)."""
    import cupy as cp

    mib = 1 << 20
    x = lib.ump_cupy_malloc(s.ptr, 8 * mib, 0)
    y = lib.ump_cupy_malloc(s.ptr, 8 * mib, 0)
    assert x and y, "allocation failed"
    assert y + 8 * mib == x, f"stream pools cut blocks from the end of free memory: {y:#x} {x:#x}"
    gx = cp.ndarray((2 * mib,), cp.uint32, cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(x, 8 * mib, None, 0), 0))
    # The fill kernel is compiled before the spin: a first fill of uint32 compiles it, which
    # on a machine with no kernel cache outlasted the spin (the stream was idle again when the
    # host wrote, so the control could not show the race).
    cp.zeros(4, cp.uint32).fill(0xA5A5A5A5)
    cp.cuda.Device().synchronize()
    _spin(s, 1000)
    with s:
        gx.fill(0xA5A5A5A5)  # queued behind the spin
    del gx
    lib.ump_cupy_free(s.ptr, x, 0)
    if use_realloc:
        p = lib.ump_realloc(y, 16 * mib)
        assert p, "ump_realloc failed"
        n = 16 * mib
    else:
        p = lib.ump_cupy_malloc(s.ptr, 8 * mib, 0)
        assert p == x, f"the control expects x's memory again: {p:#x} {x:#x}"
        n = 8 * mib
    h = np.ctypeslib.as_array((ctypes.c_uint32 * (n // 4)).from_address(p))
    want = np.random.default_rng(int.from_bytes(os.urandom(4), "little")).integers(
        0, 1 << 31, n // 4, dtype=np.uint32)
    pending = not s.done  # the marker kernel has not run yet: the race is open
    h[:] = want  # the host writes what it got
    print(f"{'realloc' if use_realloc else 'control'}: stream still busy when the host wrote: {pending}")
    s.synchronize()
    got = h.copy()
    lib.ump_cupy_free(s.ptr, p, 0)
    if not use_realloc:
        lib.ump_cupy_free(s.ptr, y, 0)
    return want, got


def device_realloc_waits_for_the_stream():
    """ump_realloc of a device-side (managed) block from the host may grow it over memory freed
    in its stream's order, or copy it into such memory, while a kernel queued before the free
    still writes there: realloc must wait for the stream before the host touches the memory.
    The control takes x's memory with an allocation on the stream (legitimate for GPU work on
    the stream) and writes it from the host with no wait: the kernel's marker then overwrites
    the host's pattern, which shows that the race is real in this setting."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    lib = _lib_handle()
    cp.ones(1)
    # Each round on a stream of its own: a new stream's pool cuts x and y from a whole free
    # chunk, so y lies just below x (the first round's frees leave its pool's free memory in
    # another order).
    want, got = _realloc_race(lib, cp.cuda.Stream(non_blocking=True), use_realloc=False)
    marker = int(np.count_nonzero(got == 0xA5A5A5A5))
    assert not np.array_equal(got, want) and marker > 0, (
        "the control did not reproduce the race (the kernel finished before the host wrote?)"
    )
    print(f"control: {marker} words of the kernel's marker over the host's pattern")
    want, got = _realloc_race(lib, cp.cuda.Stream(non_blocking=True), use_realloc=True)
    bad = int(np.count_nonzero(got != want))
    assert bad == 0, f"{bad} words differ after ump_realloc (marker: {int(np.count_nonzero(got == 0xA5A5A5A5))})"
    print("ump_realloc waited for the stream: the host's pattern is intact over all 16 MiB")


def cupy_staging_fallback():
    """A pinned-memory allocator that gives nothing makes CuPy send a NumPy temporary with
    ``copy_from_host_async`` and drop it on return (CuPy's own ``TestAsarray`` with
    ``pinned_alloc_fails``). On ump-alloc's pinned host side that copy is a real DMA, so while
    such an allocator is set ``cupy.asarray`` blocks and the copy is right. Random data behind a
    busy stream; the control (CuPy's own asarray, non-blocking) shows the corruption, so the
    check can fail. CuPy's pool set back: asarray no longer blocks."""
    import cupy as cp

    import ump_alloc
    from ump_alloc import _cupy_staging

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    x = rng.random(1 << 22)
    k = cp.ones((4096, 4096), cp.float32)  # the first use of the GPU: NumPy's memory is pinned now
    cp.cuda.Device().synchronize()
    src = x.reshape(1024, -1)[:, ::2]  # not contiguous: order="F" needs a temporary
    ident = ump_alloc.identify(np.asarray(src, order="F"))
    assert ident.ours and ident.device_accessible, ident

    def trials(asarray):
        wrong = 0
        for _ in range(4):
            for _ in range(40):
                k @ k  # the copy waits behind these on the stream
            g = asarray(src, order="F")
            y = np.full(src.size, -1.0)  # takes the temporary's memory if it is free
            cp.cuda.Device().synchronize()
            wrong += not np.array_equal(cp.asnumpy(g), src)
            del y
        return wrong

    assert not _cupy_staging.blocking()
    cp.cuda.set_pinned_memory_allocator(lambda _: None)
    try:
        assert _cupy_staging.blocking()
        cupys_own = _cupy_staging._wrapped[(id(cp), "asarray")][1]
        control = trials(cupys_own)
        print(f"control, CuPy's asarray: {control}/4 copies wrong")
        assert control > 0, "the control did not reproduce the race: the check cannot fail"
        wrong = trials(cp.asarray)
        print(f"ump-alloc: {wrong}/4 copies wrong")
        assert wrong == 0
        wrong = trials(lambda a, order: cp.array(a, order=order))
        assert wrong == 0, f"cupy.array: {wrong}/4 copies wrong"
    finally:
        cp.cuda.set_pinned_memory_allocator(cp.get_default_pinned_memory_pool().malloc)
    assert not _cupy_staging.blocking()
    assert trials(cp.asarray) == 0  # CuPy's pool: a staging buffer, watched by CuPy itself
