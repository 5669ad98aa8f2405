"""CuPy allocation latency: alloc+free through CuPy's default pool, ump-alloc's C fast path and
ump-alloc's Python fallback, side by side in one process (the allocator is switched between
rounds, rounds interleaved; medians of the rounds).

    python benches/cupy_alloc_bench.py [--n 200000] [--rounds 7] [--sizes 256,4096,1048576]

Pin it to one core for stable numbers (``taskset -c 3``). Exits 0 with a message without a GPU
or CuPy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


_TRIVIAL_C = r"""
#include <stddef.h>
static char buf[1 << 20];
void *triv_malloc(void *p, size_t s, int d) { (void)p; (void)s; (void)d; return buf; }
void triv_free(void *p, void *q, int d) { (void)p; (void)q; (void)d; }
"""


def _floor_allocator(cp):
    """A CFunctionAllocator over C functions that do nothing (built with cc if present)."""
    import ctypes
    import os
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    d = tempfile.mkdtemp()
    src, so = os.path.join(d, "triv.c"), os.path.join(d, "libtriv.so")
    with open(src, "w") as f:
        f.write(_TRIVIAL_C)
    if subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, src]).returncode != 0:
        return None
    lib = ctypes.CDLL(so)
    addr = lambda fn: ctypes.cast(fn, ctypes.c_void_p).value  # noqa: E731
    return cp.cuda.memory.CFunctionAllocator(0, addr(lib.triv_malloc), addr(lib.triv_free), lib).malloc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000, help="alloc+free pairs per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sizes", default="256,4096,1048576")
    args = p.parse_args()
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print(f"skipped: no CuPy GPU ({e})")
        return 0
    import ump_alloc
    from ump_alloc import _cupy

    ump_alloc.enable(torch=False)
    fast = _cupy.allocator()
    assert _cupy.fast_path(), "the C fast path is not available with this CuPy"
    slow = _cupy._make_python_allocator(cp)
    pool = cp.get_default_memory_pool().malloc
    allocators = {"cupy pool": pool, "ump fast": fast, "ump python": slow}
    floor = _floor_allocator(cp)
    if floor is not None:
        # CuPy's own cost for a C allocator that does nothing: what no C allocator can beat.
        allocators["C floor"] = floor
    sizes = [int(s) for s in args.sizes.split(",")]
    res = {(a, s): [] for a in allocators for s in sizes}
    alloc = cp.cuda.memory.alloc
    for r in range(args.rounds):
        for name, fn in allocators.items():
            cp.cuda.set_allocator(fn)
            for s in sizes:
                for _ in range(1000):
                    m = alloc(s)
                    del m
                t = time.perf_counter()
                for _ in range(args.n):
                    m = alloc(s)
                    del m
                res[(name, s)].append((time.perf_counter() - t) / args.n * 1e9)
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    cp.cuda.set_allocator(fast)
    print(f"{'size':>9}  " + "  ".join(f"{a:>11}" for a in allocators) + "  fast/pool  python/pool")
    for s in sizes:
        med = {a: statistics.median(res[(a, s)]) for a in allocators}
        print(f"{s:>9}  " + "  ".join(f"{med[a]:>8.0f} ns" for a in allocators)
              + f"  {med['ump fast'] / med['cupy pool']:>9.3f}  {med['ump python'] / med['cupy pool']:>11.3f}")
    print("(ratios of medians; 'C floor': CuPy's own cost around a C allocator that does nothing)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
