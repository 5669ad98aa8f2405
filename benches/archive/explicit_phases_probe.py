"""Where issue 35's explicit CuPy pipeline loses to the unchanged one: each phase timed alone.

The pipeline of issue 35 (256 MiB float32): NumPy pre-processing ``h = src * c``; to the GPU;
three elementwise kernels; back to NumPy; the host reads ``r[::1024].sum()`` and ``r.max()``.
Programs: ``unchanged`` (``cupy.asarray``/``cupy.asnumpy``) and ``explicit``
(``ump_alloc.asarray(h, like="cupy")``/``ump_alloc.asnumpy``), each in a fresh interpreter,
under ``UMP_ALLOC=1`` (``ump``) or with ump-alloc imported but not switched on (``plain``).
Each iteration is timed whole (no synchronisation inside) and then phase by phase (the device
synchronised after each phase), medians of ``--iters``.

Part 2: ``asnumpy`` of 1 GiB and a host read of every element, against a copy into a pinned
buffer made once (``cupyx.empty_pinned``) and the same read; copy and read timed apart.

    python benches/archive/explicit_phases_probe.py [--iters 8] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r'''
import json, sys, time
import numpy as np
import cupy as cp
import cupyx
import ump_alloc
program, iters = sys.argv[1], int(sys.argv[2])
n = 256 * 2**20 // 4
src = np.random.default_rng(0).random(n, dtype=np.float32)
if program == "unchanged":
    to_gpu, to_host = cp.asarray, cp.asnumpy
else:
    to_gpu = lambda h: ump_alloc.asarray(h, like="cupy")
    to_host = lambda g: ump_alloc.asnumpy(g)
sync = cp.cuda.Device().synchronize
def step(phases=None):
    t = [time.perf_counter()]
    def mark():
        if phases is not None:
            sync(); t.append(time.perf_counter())
    h = src * 1.5; mark()
    g = to_gpu(h); mark()
    g = cp.sqrt(g); g *= 3.0; g += 1.0; mark()
    r = to_host(g); mark()
    v = float(r[::1024].sum()) + float(r.max()); mark()
    if phases is not None:
        phases.append([b - a for a, b in zip(t, t[1:])])
    return v, g, r
v0, g, r = step(); step(); sync()
kinds = {"h": ump_alloc.identify(src * 1.5).kind, "g": ump_alloc.identify(g).kind, "r": ump_alloc.identify(r).kind,
         "g_is_view": ump_alloc.is_zero_copy(g, src), "r_base_none": r.base is None}
whole = []
for _ in range(iters):
    t = time.perf_counter(); step(); sync(); whole.append(time.perf_counter() - t)
ph = []
for _ in range(iters):
    step(ph)
med = lambda xs: sorted(xs)[len(xs) // 2] * 1e3
out = {"program": program, "whole_ms": med(whole), "whole_all": [round(x * 1e3, 2) for x in whole],
       "phases_ms": {k: med([p[i] for p in ph]) for i, k in enumerate(("numpy", "to_gpu", "kernels", "to_host", "read"))},
       "kinds": kinds, "mode": ump_alloc.mode() if ump_alloc.is_enabled() else "off"}
if program == "unchanged":
    big = cp.random.random(2**30 // 4, dtype=cp.float32); sync()
    pinned = cupyx.empty_pinned(big.shape, big.dtype)
    res = {"asnumpy": [], "pinned": []}
    for _ in range(5):
        t0 = time.perf_counter(); a = ump_alloc.asnumpy(big); t1 = time.perf_counter(); a.max(); t2 = time.perf_counter()
        res["asnumpy"].append((t1 - t0, t2 - t1)); del a
        t0 = time.perf_counter(); big.get(out=pinned); t1 = time.perf_counter(); pinned.max(); t2 = time.perf_counter()
        res["pinned"].append((t1 - t0, t2 - t1))
    out["gib"] = {k: {"copy_ms": med([x[0] for x in v]), "read_ms": med([x[1] for x in v]),
                      "total_ms": med([x[0] + x[1] for x in v])} for k, v in res.items()}
    a = ump_alloc.asnumpy(big)
    out["gib"]["asnumpy_kind"] = ump_alloc.identify(a).kind
print(json.dumps(out))
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    from _benchutil import gpu_or_skip, ump_env

    gpu_or_skip("cupy")
    configs = [("ump", "unchanged"), ("ump", "explicit"), ("plain", "explicit"), ("plain", "unchanged")]
    for rnd in range(args.rounds):
        for env_name, program in configs if rnd % 2 == 0 else configs[::-1]:
            env = ump_env({"UMP_ALLOC": "1"} if env_name == "ump" else {})
            r = subprocess.run([sys.executable, "-c", WORKER, program, str(args.iters)], capture_output=True,
                               text=True, env=env)
            line = r.stdout.strip().splitlines()[-1] if r.returncode == 0 else r.stderr.strip()[-800:]
            print(json.dumps({"round": rnd, "env": env_name, "result": line}), flush=True)


if __name__ == "__main__":
    main()
