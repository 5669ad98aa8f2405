"""Allocation churn: a training-style loop that allocates, computes and frees tensors of mixed
sizes, on ump-alloc against the native allocators (CuPy's default MemoryPool, PyTorch's caching
allocator). Each configuration runs in a fresh process (the allocator is fixed per process).

    python3 benches/churn_bench.py            # all four runs, prints a table and JSON
    python3 benches/churn_bench.py torch ump  # one run (what the table runs)

Reported per run: seconds for the timed iterations (after warm-up, synchronised), and peak
memory: bytes reserved from the driver (torch: max_memory_reserved; CuPy pool: total_bytes,
which never shrinks without free_all_blocks; ump: the device's mapped_peak) and bytes in use
at the peak (torch: max_memory_allocated; ump: in_use_peak).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

WARMUP = int(os.environ.get("CHURN_WARMUP", "20"))
ITERS = int(os.environ.get("CHURN_ITERS", "200"))
SEED = 1234


def torch_loop(use_ump: bool) -> dict:
    if use_ump:
        import ump_alloc

        ump_alloc.enable(cupy=False, torch=True)
    import torch

    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    dev = "cuda"
    d, h = 1024, 4096
    layers = [
        (torch.randn(d, h, device=dev) * 0.02, torch.randn(h, d, device=dev) * 0.02) for _ in range(4)
    ]
    params = [p for pair in layers for p in pair]
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.SGD(params, lr=1e-3)

    def step():
        # Mixed sizes: the number of tokens changes every iteration (dynamic batching).
        tokens = int(rng.choice([256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]))
        x = torch.randn(tokens, d, device=dev)
        target = torch.randn(tokens, d, device=dev)
        for w1, w2 in layers:
            x = x + torch.nn.functional.gelu(x @ w1) @ w2
        loss = torch.nn.functional.mse_loss(x, target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    if use_ump:
        ump_alloc.reset_peak()
    else:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    assert torch.isfinite(loss).item()
    if use_ump:
        s = ump_alloc.stats()["devices"][0]
        # The peak since the reset, plus what the warm-up left mapped (reset_peak keeps it).
        reserved, in_use = s["mapped_peak"], s["in_use_peak"]
    else:
        reserved, in_use = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    return {"seconds": dt, "peak_reserved": reserved, "peak_in_use": in_use, "loss": float(loss)}


def cupy_loop(use_ump: bool) -> dict:
    if use_ump:
        import ump_alloc

        ump_alloc.enable(torch=False)
    import cupy as cp

    rng = np.random.default_rng(SEED)
    cp.random.seed(SEED)
    w = cp.random.standard_normal((2048, 2048), dtype=cp.float32) * 0.02

    def step():
        rows = int(rng.choice([128, 256, 512, 1024, 2048, 4096, 8192]))
        x = cp.random.standard_normal((rows, 2048), dtype=cp.float32)
        y = cp.tanh(x @ w)
        z = (y * y).sum(axis=1, keepdims=True)
        y = y / cp.sqrt(z + 1e-6)
        g = x.T @ y  # a gradient-like reduction
        m = cp.maximum(y, 0).mean()
        small = [cp.arange(int(rng.integers(1, 5000)), dtype=cp.float32) for _ in range(8)]
        return float(m) + float(g[0, 0]) * 0 + sum(float(s[-1]) for s in small) * 0

    for _ in range(WARMUP):
        step()
    cp.cuda.Device().synchronize()
    if use_ump:
        ump_alloc.reset_peak()
    t0 = time.perf_counter()
    for _ in range(ITERS):
        r = step()
    cp.cuda.Device().synchronize()
    dt = time.perf_counter() - t0
    assert np.isfinite(r)
    if use_ump:
        s = ump_alloc.stats()["devices"][0]
        reserved, in_use = s["mapped_peak"], s["in_use_peak"]
    else:
        pool = cp.get_default_memory_pool()
        reserved, in_use = pool.total_bytes(), None
    return {"seconds": dt, "peak_reserved": reserved, "peak_in_use": in_use}


def one(lib: str, which: str) -> dict:
    fn = torch_loop if lib == "torch" else cupy_loop
    r = fn(which == "ump")
    if which == "ump":
        import ump_alloc

        r["mode"] = ump_alloc.mode()
    return r


def main() -> None:
    import argparse

    import _benchutil

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("lib", nargs="?", choices=["cupy", "torch"], help="one run only (what the table runs)")
    ap.add_argument("which", nargs="?", choices=["native", "ump"])
    args = ap.parse_args()
    if args.lib and args.which:
        print("RESULT " + json.dumps(one(args.lib, args.which)))
        return
    if args.lib or args.which:
        ap.error("give both LIB and WHICH, or neither")
    _benchutil.gpu_or_skip()
    results = {}
    for lib in ("cupy", "torch"):
        for which in ("native", "ump"):
            print(f"running {lib}/{which} ...", file=sys.stderr, flush=True)
            out = subprocess.run(
                [sys.executable, __file__, lib, which], capture_output=True, text=True, timeout=600
            )
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if out.returncode != 0 or not line:
                print(out.stdout, out.stderr, file=sys.stderr)
                raise SystemExit(f"{lib}/{which} failed")
            results[(lib, which)] = json.loads(line[0][7:])
    print(f"churn: {WARMUP} warm-up + {ITERS} timed iterations")
    print(f"{'library':<8} {'allocator':<8} {'seconds':>9} {'peak reserved MiB':>18} {'peak in use MiB':>16}")
    for (lib, which), r in results.items():
        iu = f"{r['peak_in_use'] / 2**20:16.1f}" if r["peak_in_use"] is not None else f"{'n/a':>16}"
        print(f"{lib:<8} {which + ('/' + r['mode'] if 'mode' in r else ''):<8} {r['seconds']:9.3f} "
              f"{r['peak_reserved'] / 2**20:18.1f} {iu}")
    for lib in ("cupy", "torch"):
        n, u = results[(lib, "native")], results[(lib, "ump")]
        print(f"{lib}: time ratio ump/native = {u['seconds'] / n['seconds']:.3f}; "
              f"peak reserved ratio = {u['peak_reserved'] / n['peak_reserved']:.3f}"
              + (f"; peak in-use ratio = {u['peak_in_use'] / n['peak_in_use']:.3f}" if n["peak_in_use"] else ""))
    print("JSON " + json.dumps({f"{k[0]}/{k[1]}": v for k, v in results.items()}))


if __name__ == "__main__":
    main()
