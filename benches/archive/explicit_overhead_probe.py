"""What one explicit transfer call costs beyond CuPy's own (issue 35), and how fast an array
made before the process's first use of a GPU is copied. Needs a GPU and CuPy; run it under
``UMP_ALLOC=1``.

    UMP_ALLOC=1 python benches/archive/explicit_overhead_probe.py [--mib 256] [--reps 30]

Part 1, per call (median of ``--reps``, the device synchronised after each): the transfer plan
alone (``ump_plan_transfer`` for host -> device and device -> host), ``cupy.asarray`` against
``ump_alloc.asarray(h, like="cupy")`` and ``cupy.asnumpy`` against ``ump_alloc.asnumpy`` on the
same arrays, and the new host array of a copy (``np.empty`` inside ump-alloc's allocating
context against plain ``np.empty``).

Part 2: the array ``h`` of part 1 was made before the first GPU use; with ``UMP_ALLOC_PIN=lazy``
(the default) on a kernel that gives shared memory 4 KiB pages, such a large block stays plain
host memory (``identify(h).kind``), so copying it runs at pageable speed, while an array made
afterwards is pinned. The last line times one copy of each.

This is the probe behind docs/benchmarks-archive.md, "Stream ordering in stream/, the pool's
data model, and the whole GPU suite".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    import _benchutil

    _benchutil.gpu_or_skip("cupy")
    import cupy as cp
    import numpy as np

    import ump_alloc

    n = args.mib * 2**20 // 4
    src = np.random.default_rng(0).random(n, dtype=np.float32)
    h = src * 1.5  # made before the first use of the GPU
    kind_before = ump_alloc.identify(h).kind
    g = cp.asarray(h)
    sync = cp.cuda.Device().synchronize
    sync()

    def us(f):
        f()
        xs = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            f()
            sync()
            xs.append(time.perf_counter() - t0)
        return statistics.median(xs) * 1e6

    tp = ump_alloc.transfer_plan
    rows = [
        ("transfer plan, host -> device", us(lambda: tp(h, "device"))),
        ("transfer plan, device -> host", us(lambda: tp(g, "host"))),
        ("cupy.asarray", us(lambda: cp.asarray(h))),
        ('ump_alloc.asarray(like="cupy")', us(lambda: ump_alloc.asarray(h, like="cupy"))),
        ("cupy.asnumpy", us(lambda: cp.asnumpy(g))),
        ("ump_alloc.asnumpy", us(lambda: ump_alloc.asnumpy(g))),
    ]
    print(f"{args.mib} MiB float32, median of {args.reps} calls, device synchronised after each; mode {ump_alloc.mode()}")
    for name, v in rows:
        print(f"  {name:34s} {v:10.1f} us")
    after = src * 2.0  # made after the first use of the GPU
    t0 = time.perf_counter()
    cp.asarray(h)
    sync()
    t_before = time.perf_counter() - t0
    t0 = time.perf_counter()
    cp.asarray(after)
    sync()
    t_after = time.perf_counter() - t0
    print(
        f"array made before the first GPU use: {kind_before} -> {ump_alloc.identify(h).kind}, "
        f"cupy.asarray {t_before * 1e3:.1f} ms; made after: {ump_alloc.identify(after).kind}, "
        f"{t_after * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
