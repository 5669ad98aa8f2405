"""Where ``ump_alloc.asnumpy``'s DMA copy of a GPU array spends its time, against the
baseline of issue 22's d2h benchmark (``x.get(out=pinned)`` into a pinned array made
beforehand): the transfer plan, the new destination array, the copy, ``asnumpy`` whole, and
the host's read (``h.max()``) of either destination. Needs a GPU and CuPy.

    python benches/archive/asnumpy_parts_probe.py [--gib 1] [--rounds 9]

Each line: the median of ``--rounds`` calls in ms, with the fastest and slowest; the GPU
rewrites the array before each call. It also says whether a new destination gets the same
address again (the pool hands back the block just freed). This is the probe behind
docs/benchmarks-archive.md, "Explicit transfers, view or DMA copy", its "Where the d2h difference sits".
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    import _benchutil

    _benchutil.gpu_or_skip("cupy")
    import cupy as cp
    import numpy as np

    import ump_alloc

    ump_alloc.enable(torch=False)  # NumPy too: np.empty is on ump-alloc's host side, as asnumpy's copy
    n = int(args.gib * 2**30) // 4
    x = cp.empty(n, cp.float32)
    x.fill(1)
    cp.cuda.Device().synchronize()
    pinned = np.empty(n, np.float32)

    def timed(f) -> str:
        v = []
        for _ in range(args.rounds):
            x.fill(2)
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            r = f()
            v.append((time.perf_counter() - t0) * 1e3)
            del r
        v.sort()
        return f"{v[len(v) // 2]:7.2f} ms (min {v[0]:.2f}, max {v[-1]:.2f})"

    # The public API only: transfer_plan() is the plan asnumpy makes (it also describes the
    # array, which the plan of the archived figures, taken from a private module, did not), and
    # with ump-alloc enabled np.empty makes the destination asnumpy's copy gets.
    def host_empty():
        return np.empty(x.shape, x.dtype)

    print("transfer_plan   ", timed(lambda: ump_alloc.transfer_plan(x, "host", touch=1.0)))
    print("host_empty      ", timed(host_empty))
    print("host_empty+fill1", timed(lambda: host_empty().__setitem__(slice(0, None, 1024), 0)))
    print("get(out=pinned) ", timed(lambda: x.get(out=pinned)))
    print("get(out=new)    ", timed(lambda: x.get(out=host_empty())))
    print("asnumpy         ", timed(lambda: ump_alloc.asnumpy(x)))
    h1 = host_empty()
    a1 = h1.ctypes.data
    del h1
    h2 = host_empty()
    a2 = h2.ctypes.data
    del h2
    print("same address again:", a1 == a2, hex(a1), hex(a2))
    print("read pinned max ", timed(lambda: pinned.max()))
    h = ump_alloc.asnumpy(x)
    print("read asnumpy'd  ", timed(lambda: h.max()))
    print(ump_alloc.stats().get("host", list(ump_alloc.stats())))


if __name__ == "__main__":
    main()
