"""Does a kernel on ump-alloc's managed memory survive another process filling the GPU?

Issue 35's CuPy suite runs (docs/benchmarks-archive.md §37) showed kernels faulting with
``CUDA_ERROR_ILLEGAL_ADDRESS`` on managed memory while another process held 70 % of the GPU.
This probe tests the hypothesis: a holder process takes ``--hold`` of the GPU's free memory
with ``cudaMalloc`` and keeps it; meanwhile a fresh process per configuration (plain CuPy,
``UMP_ALLOC=1``, ``UMP_ALLOC=1 UMP_ALLOC_MODE=device``) makes a ``--mib`` MiB array, runs a
kernel on it and checks the result. It prints each configuration's outcome (``ok`` with the
memory kind, or the error). Plain CuPy's expected answer at a high ``--hold`` is an
``OutOfMemoryError`` at allocation, never a fault in a kernel.

    python benches/archive/managed_pressure_probe.py [--hold 0.97] [--mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HOLDER = r'''
import sys, time
import cupy as cp
free, total = cp.cuda.runtime.memGetInfo()
n = int(free * float(sys.argv[1]))
p = cp.cuda.runtime.malloc(n)
print(n, total, flush=True)
time.sleep(float(sys.argv[2]))
'''

WORKER = r'''
import json, sys
import cupy as cp
import ump_alloc
mib = int(sys.argv[1])
try:
    a = cp.ones(mib << 18, cp.float32)
    a *= 2
    cp.cuda.Device().synchronize()
    ok = float(a[: 1 << 10].sum()) == 2048.0
    print(json.dumps({"outcome": "ok" if ok else "wrong values", "kind": ump_alloc.identify(a).kind}))
except Exception as e:  # noqa: BLE001 - the outcome is what is measured
    print(json.dumps({"outcome": type(e).__name__, "message": str(e)[:200]}))
'''

CONFIGS = {"plain": {}, "ump": {"UMP_ALLOC": "1"}, "ump-device": {"UMP_ALLOC": "1", "UMP_ALLOC_MODE": "device"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hold", type=float, default=0.97, help="share of the free GPU memory the holder takes")
    ap.add_argument("--mib", type=int, default=256)
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    from _benchutil import gpu_or_skip, ump_env

    gpu_or_skip("cupy")
    out = {"hold": args.hold, "mib": args.mib, "configs": {}}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(args.hold), "120"], stdout=subprocess.PIPE,
                              text=True, env=ump_env({}))
    try:
        held, total = (int(x) for x in holder.stdout.readline().split())
        out["held_gib"], out["total_gib"] = round(held / 2**30, 1), round(total / 2**30, 1)
        time.sleep(1)
        for name, settings in CONFIGS.items():
            r = subprocess.run([sys.executable, "-c", WORKER, str(args.mib)], capture_output=True, text=True,
                               env=ump_env(settings), timeout=120)
            lines = r.stdout.strip().splitlines()
            out["configs"][name] = json.loads(lines[-1]) if lines else {"outcome": f"exit {r.returncode}",
                                                                        "stderr": r.stderr[-300:]}
    finally:
        holder.kill()
        holder.wait()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
