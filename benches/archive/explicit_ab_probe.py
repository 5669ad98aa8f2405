"""Issue 35's pipeline (CuPy or PyTorch), explicit and unchanged iterations alternating in one process.

The cross-process rounds of ``explicit_phases_probe.py`` put each program in its own
interpreter, and the interpreters drift by more than the two programs differ (the unchanged
program alone moved from 84.7 to 75.4 ms/iteration across rounds). Here one interpreter under
``UMP_ALLOC=1`` runs the pipeline (256 MiB float32: NumPy ``h = src * 1.5``; to the GPU; three
elementwise kernels; back to NumPy; the host reads ``r[::1024].sum()`` and ``r.max()``) with
the two programs' transfer calls in alternating order (ABBA pairs): ``cupy.asarray`` and
``cupy.asnumpy`` (``--lib torch``: ``torch.from_numpy(h).cuda()`` and ``t.cpu().numpy()``)
against ``ump_alloc.asarray(h, like=...)`` and ``ump_alloc.asnumpy``, each iteration timed
whole with the device synchronised at its end. It prints the medians, the ratio of medians and
the median of the pair ratios (explicit over unchanged: below 1.0, explicit is faster); then
the same pairs again with the device synchronised after each phase, and each phase's median
per program. It runs itself under ``UMP_ALLOC=1``.

    python benches/archive/explicit_ab_probe.py [--mib 256] [--pairs 20] [--lib cupy|torch]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--lib", choices=("cupy", "torch"), default="cupy")
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    from _benchutil import gpu_or_skip, run_under_ump

    gpu_or_skip(args.lib)
    # Both programs run under ump-alloc: run again, switched on from the start.
    run_under_ump()
    import numpy as np

    import ump_alloc

    assert ump_alloc.is_enabled(), "UMP_ALLOC=1 did not switch ump-alloc on"
    n = args.mib * 2**20 // 4
    src = np.random.default_rng(0).random(n, dtype=np.float32)
    if args.lib == "cupy":
        import cupy as xp

        sync = xp.cuda.Device().synchronize
        unchanged = (xp.asarray, xp.asnumpy)
    else:
        import torch as xp

        sync = xp.cuda.synchronize
        unchanged = (lambda h: xp.from_numpy(h).cuda(), lambda t: t.cpu().numpy())
    programs = {
        "unchanged": unchanged,
        "explicit": (lambda h: ump_alloc.asarray(h, like=args.lib), ump_alloc.asnumpy),
    }

    def step(name: str, phases: list | None = None) -> tuple[float, float]:
        to_gpu, to_host = programs[name]
        t = [time.perf_counter()]

        def mark() -> None:
            if phases is not None:
                sync()
                t.append(time.perf_counter())

        h = src * 1.5
        mark()
        g = to_gpu(h)
        mark()
        g = xp.sqrt(g)
        g *= 3.0
        g += 1.0
        mark()
        r = to_host(g)
        mark()
        v = float(r[::1024].sum()) + float(r.max())
        sync()
        t.append(time.perf_counter())
        if phases is not None:
            phases.append([b - a for a, b in zip(t, t[1:])])
        return t[-1] - t[0], v

    # Warm both (kernels compiled, pools filled), and check they compute the same.
    ref = [step(p)[1] for p in programs for _ in range(2)]
    assert max(ref) - min(ref) <= 1e-3 * abs(ref[0]), ref
    times: dict[str, list[float]] = {p: [] for p in programs}
    pairs = []
    for i in range(args.pairs):
        order = ("unchanged", "explicit") if i % 2 == 0 else ("explicit", "unchanged")
        got = {p: step(p)[0] for p in order}
        for p, s in got.items():
            times[p].append(s)
        pairs.append(got["explicit"] / got["unchanged"])

    def med(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2]

    # Then phase by phase (the device synchronised after each phase), in the same ABBA order.
    ph: dict[str, list] = {p: [] for p in programs}
    for i in range(args.pairs):
        order = ("unchanged", "explicit") if i % 2 == 0 else ("explicit", "unchanged")
        for p in order:
            step(p, ph[p])
    names = ("numpy", "to_gpu", "kernels", "to_host", "read")

    out = {
        "lib": args.lib,
        "mib": args.mib,
        "pairs": args.pairs,
        "unchanged_ms": round(med(times["unchanged"]) * 1e3, 2),
        "explicit_ms": round(med(times["explicit"]) * 1e3, 2),
        "ratio_of_medians": round(med(times["explicit"]) / med(times["unchanged"]), 4),
        "median_pair_ratio": round(med(pairs), 4),
        "pair_ratio_range": [round(min(pairs), 3), round(max(pairs), 3)],
        "phases_ms": {p: {k: round(med([x[i] for x in ph[p]]) * 1e3, 2) for i, k in enumerate(names)} for p in ph},
        "kinds": {"h": ump_alloc.identify(src * 1.5).kind},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
