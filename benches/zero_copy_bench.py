"""Zero-copy against copies on a GPU, side by side in one run (docs/BENCHMARKS.md).

    python benches/zero_copy_bench.py transfer      # 1 GiB: asnumpy view vs cupy.asnumpy vs pinned copy
    python benches/zero_copy_bench.py bandwidth     # elementwise kernel on ump memory vs cudaMalloc memory
    python benches/zero_copy_bench.py threshold     # host read of GPU-written managed memory: faults vs prefetch
    python benches/zero_copy_bench.py cupy_alloc    # CuPy alloc+free: ump-alloc vs CuPy's default pool

Each prints a table; medians of several repetitions; the GPU writes fresh data before every
measured transfer so that nothing is already on the host.
"""

import os
import statistics
import sys
import time

import numpy as np


def _med(xs):
    return statistics.median(xs)


def transfer(reps=7):
    """1 GiB written by a kernel, then brought to the host three ways. The copies use NumPy's
    default allocator for their destination (what users have); ump-alloc runs in the mode of
    UMP_ALLOC_MODE (auto: managed on the H200). The host then reads every byte (h.max())."""
    import cupy as cp

    import ump_alloc

    n = 2**30 // 4
    write = cp.ElementwiseKernel("float32 v", "float32 y", "y = v + (float)(i & 1023)", "w")
    dev = cp.empty(n, cp.float32)  # plain device memory from CuPy's default pool
    pinned_mem = cp.cuda.alloc_pinned_memory(n * 4)
    pinned = np.frombuffer(pinned_mem, np.float32, n)
    rows = {}

    def timed(name, target, transfer_fn):
        t_k, t_x, t_e2e = [], [], []
        for r in range(reps):
            cp.cuda.Device().synchronize()
            k0 = time.perf_counter()
            write(np.float32(r), target)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            h = transfer_fn()
            t1 = time.perf_counter()
            m = float(h.max())  # the host reads every byte
            t2 = time.perf_counter()
            assert m == r + 1023.0, (name, m)
            t_k.append(t0 - k0)
            t_x.append(t1 - t0)
            t_e2e.append(t2 - t0)
            del h
        rows[name] = (_med(t_k), _med(t_x), _med(t_e2e))

    timed("cupy.asnumpy (pageable copy)", dev, lambda: cp.asnumpy(dev))
    timed("copy into pinned memory", dev, lambda: dev.get(out=pinned))
    ump_alloc.enable(torch=False)
    um = cp.empty(n, cp.float32)
    mode = ump_alloc.mode()
    timed(f"ump asnumpy, {mode} (zero-copy)", um, lambda: ump_alloc.asnumpy(um))
    print(f"1 GiB float32 written by a kernel before each run; median of {reps}; host read = h.max()")
    print(f"{'path':<34}{'kernel (ms)':>12}{'transfer (ms)':>15}{'GB/s':>9}{'end-to-end (ms)':>17}")
    for k, (tk, tx, te) in rows.items():
        print(f"{k:<34}{tk * 1e3:>12.2f}{tx * 1e3:>15.3f}{2**30 / tx / 1e9:>9.1f}{te * 1e3:>17.1f}")
    base = rows["cupy.asnumpy (pageable copy)"]
    z = rows[f"ump asnumpy, {mode} (zero-copy)"]
    print(f"[{mode}] transfer speed-up vs cupy.asnumpy: {base[1] / z[1]:.0f}x; end-to-end: {base[2] / z[2]:.2f}x")


def bandwidth(reps=10):
    import cupy as cp

    import ump_alloc

    n = 2**30 // 4
    k = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f + 1.0f", "bw")

    def run(x, y):
        k(x, y)  # warm-up: migrates managed pages to the GPU
        cp.cuda.Device().synchronize()
        ts = []
        for _ in range(reps):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record()
            k(x, y)
            e1.record()
            e1.synchronize()
            ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        return 2 * n * 4 / _med(ts) / 1e9

    x0 = cp.random.random(n, dtype=cp.float32)
    y0 = cp.empty_like(x0)
    plain = run(x0, y0)
    ump_alloc.enable(torch=False)
    x1 = cp.empty(n, cp.float32)
    x1[...] = x0
    y1 = cp.empty_like(x1)
    assert ump_alloc.identify(x1).ours
    ump = run(x1, y1)
    assert bool((y1 == y0).all())
    print(f"elementwise y = 2x + 1 on 1 GiB (bytes read + written), median of {reps}")
    print(f"cudaMalloc (CuPy pool): {plain:8.0f} GB/s")
    print(f"ump-alloc ({ump_alloc.mode()}): {ump:8.0f} GB/s   ratio {ump / plain:.3f}")


def threshold(reps=5):
    """Host read (np.sum) of GPU-written managed memory after ump_host_access, with prefetch
    forced on (UMP_ALLOC_PREFETCH_MIN=0) or off (1T); run once per setting."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    write = cp.ElementwiseKernel("float32 v", "float32 y", "y = v", "w")
    label = os.environ.get("UMP_ALLOC_PREFETCH_MIN", "?")
    for size in [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]:
        n = size // 4
        x = cp.empty(n, cp.float32)
        ts = []
        for r in range(reps + 1):
            write(np.float32(r), x)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            h = ump_alloc.asnumpy(x)
            s = float(h.sum(dtype=np.float64))
            ts.append(time.perf_counter() - t0)
            assert s == float(r) * n
        t = _med(ts[1:])
        print(f"prefetch_min={label:<4} size {size >> 10:>7} KiB: {t * 1e6:10.1f} us  {size / t / 1e9:6.2f} GB/s")


def cupy_alloc(reps=200_000):
    import cupy as cp

    import ump_alloc

    def loop():
        sizes = [512, 4096, 65536, 1 << 20]
        for n in sizes * 100:  # warm
            cp.cuda.alloc(n)
        t0 = time.perf_counter()
        for i in range(reps):
            m = cp.cuda.alloc(sizes[i & 3])
            del m
        return (time.perf_counter() - t0) / reps

    default = loop()
    ump_alloc.enable(torch=False)
    ump = loop()
    print(f"CuPy alloc+free from Python (cupy.cuda.alloc, sizes 512 B..1 MiB), mean of {reps}")
    print(f"CuPy default pool: {default * 1e9:8.0f} ns")
    print(f"ump-alloc:         {ump * 1e9:8.0f} ns   ratio {ump / default:.2f}")


if __name__ == "__main__":
    import argparse

    import _benchutil

    commands = {"transfer": transfer, "bandwidth": bandwidth, "threshold": threshold, "cupy_alloc": cupy_alloc}
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=sorted(commands))
    args = ap.parse_args()
    _benchutil.gpu_or_skip("cupy")
    print(f"running {args.command} ...", file=sys.stderr, flush=True)
    commands[args.command]()
