"""What a process that only uses NumPy costs the GPU under ``UMP_ALLOC=1`` (issue 33): CUDA
contexts, GPU memory and start-up time, side by side with plain NumPy, in alternating rounds.

Part 1, one process: ``import numpy; np.ones(1 << 20); np.ones(1 << 26)`` and the questions a
program may ask (``identify``, ``stats``), timed from the shell's side (interpreter start-up
included), in three variants: ``plain`` (no ump-alloc), ``ump`` (``UMP_ALLOC=1``, pinning at the
first use of a GPU, the default) and ``ump-eager`` (``UMP_ALLOC_PIN=eager``: the behaviour
before issue 33, the control). Each process reports whether it holds a primary context
(``cuDevicePrimaryCtxGetState``, which makes none) and the GPU memory NVML lists for its pid.

Part 2: a ``multiprocessing`` spawn ``Pool(8)`` of NumPy-only workers under ``UMP_ALLOC=1``:
how many workers hold a context, and how much GPU memory NVML lists for them.

    python benches/no_context_bench.py [--rounds 7] [--pool 8] [--json out.json]

Goals: 0 contexts and 0 MiB for the ``ump`` process and the Pool's workers; start-up within
30 ms of ``plain`` (median of the rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PROBE = r'''
import ctypes, json, os

def contexts():
    """Devices whose primary context this process holds (read without making one)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    if cu.cuInit(0) != 0:
        return []
    n = ctypes.c_int()
    cu.cuDeviceGetCount(ctypes.byref(n))
    out = []
    for d in range(n.value):
        flags, active = ctypes.c_uint(), ctypes.c_int()
        if cu.cuDevicePrimaryCtxGetState(d, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value:
            out.append(d)
    return out

def gpu_mib(pids):
    """GPU memory NVML lists for `pids` (MiB), over every device."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    total = 0
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid in pids:
                total += (p.usedGpuMemory or 0) >> 20
    pynvml.nvmlShutdown()
    return total
'''

ONE = PROBE + r'''
import numpy as np
a = np.ones(1 << 20)
b = np.ones(1 << 26)
kind = None
if os.environ.get("UMP_ALLOC") == "1":
    import ump_alloc
    kind = ump_alloc.identify(b).kind
    ump_alloc.stats()
print(json.dumps({"kind": kind, "contexts": contexts(), "gpu_mib": gpu_mib({os.getpid()})}))
'''

POOL = PROBE + r'''
import multiprocessing as mp

def work(i):
    import numpy as np
    x = np.random.default_rng(i).random(1 << 23)   # 64 MiB: a chunk of its own
    y = (x * 2).sum()
    kind = None
    try:
        import ump_alloc
        kind = ump_alloc.identify(x).kind
    except ImportError:
        pass
    return os.getpid(), contexts(), kind, float(y)

if __name__ == "__main__":
    n = int(os.environ["POOL_N"])
    with mp.get_context("spawn").Pool(n) as pool:
        res = pool.map(work, range(n))
        pids = {r[0] for r in res}
        # Measured while the workers live (NVML lists live processes only).
        mib = gpu_mib(pids)
    print(json.dumps({"workers": n, "with_context": sum(1 for r in res if r[1]), "gpu_mib": mib,
                      "kinds": sorted({str(r[2]) for r in res}), "parent_contexts": contexts()}))
'''

VARIANTS = {
    "plain": {},
    "ump": {"UMP_ALLOC": "1"},
    "ump-eager": {"UMP_ALLOC": "1", "UMP_ALLOC_PIN": "eager"},
}


def run(code: str, env_extra: dict, path: str | None = None) -> tuple[float, dict]:
    from _benchutil import ump_env

    env = ump_env(env_extra)
    args = [sys.executable, path] if path else [sys.executable, "-c", code]
    t = time.perf_counter()
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return dt, json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--pool", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    from _benchutil import gpu_or_skip

    gpu_or_skip()
    rows: dict = {v: [] for v in VARIANTS}
    for rnd in range(args.rounds):
        order = list(VARIANTS) if rnd % 2 == 0 else list(VARIANTS)[::-1]
        for v in order:
            dt, out = run(ONE, VARIANTS[v])
            rows[v].append({"s": dt, **out})
    print(f"{'variant':<10} {'start-up + 2 arrays (median s)':>31} {'vs plain':>9} {'contexts':>9} {'GPU MiB':>8}  kind")
    base = sorted(r["s"] for r in rows["plain"])[len(rows["plain"]) // 2]
    summary = {}
    for v, rs in rows.items():
        med = sorted(r["s"] for r in rs)[len(rs) // 2]
        ctx = max(len(r["contexts"]) for r in rs)
        mib = max((r["gpu_mib"] or 0) for r in rs)
        summary[v] = {"median_s": med, "delta_ms": (med - base) * 1e3, "contexts": ctx, "gpu_mib": mib,
                      "all_s": [round(r["s"], 4) for r in rs]}
        print(f"{v:<10} {med:>31.3f} {f'+{(med - base) * 1e3:.0f} ms':>9} {ctx:>9} {mib:>8}  {rs[0]['kind']}")
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"no_context_pool_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(POOL)
    pool = {}
    for v in ("plain", "ump"):
        dt, out = run(POOL, {**VARIANTS[v], "POOL_N": str(args.pool)}, path)
        pool[v] = {"s": dt, **out}
        print(f"spawn Pool({args.pool}) {v:<6}: {out['with_context']} of {out['workers']} workers hold a CUDA "
              f"context, {out['gpu_mib']} MiB of GPU memory listed for them; worker arrays: {out['kinds']}; "
              f"{dt:.2f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"one_process": summary, "pool": pool}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
