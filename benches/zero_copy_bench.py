"""Zero-copy against copies on a GPU, side by side in one run (docs/BENCHMARKS.md).

    python benches/zero_copy_bench.py transfer      # 1 GiB: asnumpy view vs cupy.asnumpy vs pinned copy
    python benches/zero_copy_bench.py bandwidth     # elementwise kernel on ump memory vs cudaMalloc memory
    python benches/zero_copy_bench.py threshold     # host read of GPU-written managed memory: faults vs prefetch
    python benches/zero_copy_bench.py cupy_alloc    # CuPy alloc+free: ump-alloc vs CuPy's default pool
    python benches/zero_copy_bench.py d2h           # 1 GiB D2H + full host read: asnumpy's choice vs a pinned copy vs a view
    python benches/zero_copy_bench.py sparse        # host reads a fraction of 1 GiB: asnumpy(touch=) vs copies
    python benches/zero_copy_bench.py h2d           # kernels read a fraction of pinned NumPy memory: asarray(touch=) vs copies

Each prints a table; medians of several repetitions; the GPU writes fresh data before every
measured transfer so that nothing is already on the host. d2h, sparse and h2d (issue 22) take
--gib, --rounds and --json, alternate their variants round by round in one process, and print
the median with the fastest and slowest round; benches/transfer_bench.py runs them with the
pipeline, each in a fresh process.
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
    timed(f"ump asnumpy, {mode} (zero-copy)", um, lambda: ump_alloc.asnumpy(um, copy=False))
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
            h = ump_alloc.asnumpy(x, copy=False)
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


# ---- issue 22: the faster of a view and a DMA copy ----------------------------------------------


def _stats(ts):
    ts = sorted(ts)
    return {"median_ms": _med(ts) * 1e3, "min_ms": ts[0] * 1e3, "max_ms": ts[-1] * 1e3, "runs_ms": [t * 1e3 for t in ts]}


def _print_rows(title, rows, base=None):
    print(title)
    print(f"{'variant':<52}{'median (ms)':>12}{'fastest':>10}{'slowest':>10}{'vs ' + base if base else '':>16}")
    for name, r in rows.items():
        ratio = f"{rows[base]['median_ms'] / r['median_ms']:.2f}x" if base and base in rows else ""
        print(f"{name:<52}{r['median_ms']:>12.1f}{r['min_ms']:>10.1f}{r['max_ms']:>10.1f}{ratio:>16}")


def _kernel_write():
    import cupy as cp

    return cp.ElementwiseKernel("float32 v", "float32 y", "y = v + (float)(i & 1023)", "ump_w22")


def d2h(gib=1.0, rounds=7):
    """1 GiB of float32 written by a kernel (CuPy on ump-alloc's device side: managed memory
    with the default sides), then brought to the host and read whole (h.max()): asnumpy as it
    chooses (issue 22: a DMA copy here), a DMA copy into a pinned NumPy array made beforehand
    (the issue's baseline), and asnumpy(copy=False) (the view: pages migrate in the background
    while the host reads). Timed from the end of the kernel to the end of the read. Before each
    kernel the array goes back to the device (ump_alloc.device_access: it also cancels a
    background migration the previous view left running), so every variant starts alike."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = int(gib * 2**30) // 4
    write = _kernel_write()
    x = cp.empty(n, cp.float32)
    pinned = np.empty(n, np.float32)  # ump-alloc's host side: pinned with the default sides
    plan = ump_alloc.transfer_plan(x)
    variants = {
        f"asnumpy (its choice: {plan.path})": lambda: ump_alloc.asnumpy(x),
        "DMA copy into pinned memory (x.get(out=...))": lambda: x.get(out=pinned),
        "asnumpy(copy=False): view, background migration": lambda: ump_alloc.asnumpy(x, copy=False),
    }
    rows = _rounds(variants, rounds, x, write, lambda h: float(h.max()), lambda top, r: top == r + 1023.0)
    _print_rows(f"{gib:g} GiB float32 written by a kernel, then a host read of every element (h.max()); "
                f"mode {ump_alloc.mode()}, {rounds} rounds", rows, base="DMA copy into pinned memory (x.get(out=...))")
    return {"mode": ump_alloc.mode(), "bytes": n * 4, "plan": plan.reason, "rows": rows}


def _rounds(variants, rounds, x, write, read, right):
    """Time each variant round by round, alternating (round 0 warms every path up): `write`
    (a kernel) fills `x` for the round, then the variant hands it to the host and `read(h)`
    reads it there; timed from the end of the kernel to the end of the read, and
    `right(read(h), round)` must hold."""
    import cupy as cp

    import ump_alloc

    times = {k: [] for k in variants}
    for r in range(rounds + 1):
        for name, fn in variants.items():
            _to_device(ump_alloc, x)
            write(np.float32(r), x)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            h = fn()
            got = read(h)
            dt = time.perf_counter() - t0
            assert right(got, r), (name, r, got)
            if r:
                times[name].append(dt)
            del h
    return {k: _stats(v) for k, v in times.items()}


def _to_device(ump_alloc, x):
    """Managed pages back on the device (and any background migration over them cancelled),
    in the current stream's order: every variant starts from the same state."""
    import cupy as cp

    ident = ump_alloc.identify(x)
    if ident.kind == "managed":
        ump_alloc.device_access(x, device=ident.device, stream=cp.cuda.get_current_stream())


def _pages(n_pages, frac, rng, contiguous):
    k = max(1, int(round(n_pages * frac)))
    if contiguous:
        return np.arange(k)
    return np.sort(rng.choice(n_pages, size=k, replace=False))


def sparse(gib=1.0, rounds=5, fractions=(0.01, 0.05, 0.2, 0.5)):
    """A kernel writes 1 GiB of float32; the host then reads a fraction of it: whole 4 KiB
    pages picked at random (and, for 1 %, the first 1 % as one slice). Variants: asnumpy with
    the reader's hint (touch=fraction: a view that migrates nothing, the touched pages fault
    over, up to the plan's threshold), asnumpy with no hint (a DMA copy of everything),
    asnumpy(copy=False) with no hint (a view that migrates everything in the background), and a
    DMA copy into a pinned array made beforehand. The host read is NumPy fancy indexing of the
    touched pages plus a sum. Each kernel starts with the array on the device (see d2h)."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = int(gib * 2**30) // 4
    per_page = 1024
    n_pages = n // per_page
    write = _kernel_write()
    x = cp.empty(n, cp.float32)
    pinned = np.empty(n, np.float32)
    rng = np.random.default_rng(22)
    out = {"mode": ump_alloc.mode(), "bytes": n * 4, "cases": {}}
    cases = [(f, False) for f in fractions] + [(fractions[0], True)]
    for frac, contiguous in cases:
        pages = _pages(n_pages, frac, rng, contiguous)
        plan = ump_alloc.transfer_plan(x, touch=frac)
        variants = {
            f"asnumpy(touch={frac:g}) ({plan.path})": lambda: ump_alloc.asnumpy(x, touch=frac),
            "asnumpy, no hint (copy)": lambda: ump_alloc.asnumpy(x),
            "asnumpy(copy=False), no hint (view + migration)": lambda: ump_alloc.asnumpy(x, copy=False),
            "DMA copy into pinned memory": lambda: x.get(out=pinned),
        }
        def read(h, pages=pages):
            return float(h[: n_pages * per_page].reshape(n_pages, per_page)[pages].sum(dtype=np.float64))

        def right(total, r, k=len(pages)):
            want = (float(r) * per_page + 1023 * 1024 / 2) * k
            return abs(total - want) <= 1e-6 * want + 1

        rows = _rounds(variants, rounds, x, write, read, right)
        label = f"{frac:.0%} of the pages, {'the first ones' if contiguous else 'at random'}"
        _print_rows(f"host reads {label} ({len(pages)} x 4 KiB) of {gib:g} GiB written by a kernel; "
                    f"{rounds} rounds", rows, base="DMA copy into pinned memory")
        out["cases"][label] = {"touch": frac, "plan": plan.path, "rows": rows}
    return out


def h2d(gib=1.0, rounds=5, fractions=(0.01, 0.1, 0.4, 1.0, 3.0)):
    """A NumPy array of 1 GiB (ump-alloc's host side: pinned with the default sides) goes to the
    GPU and a kernel reads a fraction of it: whole 4 KiB pages picked at random (fancy indexing
    of the touched pages, then a sum), or, for a fraction above 1, every element that many
    times. Variants: asarray with the hint (touch=fraction: a view where the plan says so),
    asarray(copy=True) (a DMA copy, then the kernels), asarray(copy=False) (a view: kernels
    read over PCIe). Timed from the call to the end of the kernels."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = int(gib * 2**30) // 4
    per_page = 1024
    n_pages = n // per_page
    a = np.empty(n, np.float32)
    a[:] = 1.0
    rng = np.random.default_rng(23)
    out = {"mode": ump_alloc.mode(), "host_kind": ump_alloc.identify(a).kind, "bytes": n * 4, "cases": {}}
    for frac in fractions:
        passes = max(1, int(frac)) if frac >= 1 else 1
        pages = cp.asarray(_pages(n_pages, min(frac, 1.0), rng, False))
        plan = ump_alloc.transfer_plan(a, touch=frac)

        def kernels(g):
            total = 0.0
            for _ in range(passes):
                total += float(g[: n_pages * per_page].reshape(n_pages, per_page)[pages].sum(dtype=cp.float64))
            return total

        variants = {
            f"asarray(touch={frac:g}) ({plan.path})": lambda: ump_alloc.asarray(a, like="cupy", touch=frac),
            "asarray(copy=True): DMA copy": lambda: ump_alloc.asarray(a, like="cupy", copy=True),
            "asarray(copy=False): view over PCIe": lambda: ump_alloc.asarray(a, like="cupy", copy=False),
        }
        times = {k: [] for k in variants}
        for r in range(rounds + 1):
            for name, fn in variants.items():
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                total = kernels(fn())
                dt = time.perf_counter() - t0
                assert total == float(per_page * len(pages) * passes), (name, total)
                if r:
                    times[name].append(dt)
        rows = {k: _stats(v) for k, v in times.items()}
        _print_rows(f"kernels read {frac:g} of a {gib:g} GiB NumPy array ({out['host_kind']}); {rounds} rounds", rows,
                    base="asarray(copy=True): DMA copy")
        out["cases"][f"{frac:g}"] = {"touch": frac, "plan": plan.path, "rows": rows}
    return out


if __name__ == "__main__":
    import argparse
    import json

    import _benchutil

    commands = {"transfer": transfer, "bandwidth": bandwidth, "threshold": threshold, "cupy_alloc": cupy_alloc,
                "d2h": d2h, "sparse": sparse, "h2d": h2d}
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=sorted(commands))
    ap.add_argument("--gib", type=float, default=1.0, help="array size (d2h, sparse, h2d)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per variant (d2h, sparse, h2d)")
    ap.add_argument("--json", default=None, help="write the results there (d2h, sparse, h2d)")
    args = ap.parse_args()
    _benchutil.gpu_or_skip("cupy")
    print(f"running {args.command} ...", file=sys.stderr, flush=True)
    if args.command in ("d2h", "sparse", "h2d"):
        kw = {"gib": args.gib}
        if args.rounds is not None:
            kw["rounds"] = args.rounds
        result = commands[args.command](**kw)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    else:
        commands[args.command]()
