"""Issue 35's asnumpy + read against a pinned copy + read, alternating in one process.

A GPU array of ``--gib`` GiB (float32, random) goes to the host three ways, each followed by a
host read of every element (``a.max()``): ``ump_alloc.asnumpy`` (a new host array each time),
``cupy.asnumpy`` under ``UMP_ALLOC=1`` (the unchanged call; also a new array) and a copy into
one pinned buffer made once with ``cupyx.empty_pinned`` (the best copy the machine has). The
three run in rotating order (ABC CBA ...), ``--rounds`` cycles, copy and read timed apart with
the device synchronised after the copy. It prints each way's median copy, read and total
milliseconds, and the pinned way's total over each other way's (the ratio of medians, and the
median of the per-cycle ratios: at or above 1.0, that way is at least as fast as the pinned
copy + read). It runs itself under ``UMP_ALLOC=1``.

    python benches/archive/asnumpy_read_probe.py [--gib 1] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    from _benchutil import gpu_or_skip, run_under_ump

    gpu_or_skip("cupy")
    run_under_ump()
    import cupy as cp
    import cupyx

    import ump_alloc

    assert ump_alloc.is_enabled(), "UMP_ALLOC=1 did not switch ump-alloc on"
    n = int(args.gib * 2**30) // 4
    big = cp.random.random(n, dtype=cp.float32)
    sync = cp.cuda.Device().synchronize
    sync()
    expect = float(big.max())
    pinned = cupyx.empty_pinned(big.shape, big.dtype)

    def to_pinned():
        big.get(out=pinned)
        return pinned

    ways = {"ump_alloc.asnumpy": lambda: ump_alloc.asnumpy(big), "cupy.asnumpy": lambda: cp.asnumpy(big),
            "pinned copy": to_pinned}
    kinds = {}
    times = {k: [] for k in ways}
    for r in range(args.rounds + 1):  # the first cycle warms up and is not counted
        order = list(ways) if r % 2 == 0 else list(reversed(ways))
        for k in order:
            t0 = time.perf_counter()
            a = ways[k]()
            sync()
            t1 = time.perf_counter()
            m = float(a.max())
            t2 = time.perf_counter()
            assert m == expect, (k, m, expect)
            kinds[k] = ump_alloc.identify(a).kind
            del a
            if r:
                times[k].append((t1 - t0, t2 - t1))
    med = lambda xs: statistics.median(xs) * 1e3
    out = {"gib": args.gib, "rounds": args.rounds, "kinds": kinds, "ways": {}}
    totals = {k: [c + rd for c, rd in v] for k, v in times.items()}
    for k, v in times.items():
        out["ways"][k] = {"copy_ms": round(med([c for c, _ in v]), 2), "read_ms": round(med([rd for _, rd in v]), 2),
                          "total_ms": round(med(totals[k]), 2)}
        if k != "pinned copy":
            pairs = [p / w for p, w in zip(totals["pinned copy"], totals[k])]
            out["ways"][k]["pinned_over_this"] = round(med(totals["pinned copy"]) / med(totals[k]), 4)
            out["ways"][k]["median_cycle_ratio"] = round(statistics.median(pairs), 4)
            out["ways"][k]["cycle_ratio_range"] = [round(min(pairs), 3), round(max(pairs), 3)]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
