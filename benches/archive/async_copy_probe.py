"""Asynchronous copies whose host buffer a program drops or reads early: right on pageable
memory, wrong on pinned memory unless something keeps the buffer. Each pattern runs behind a
busy stream (``torch.cuda._sleep`` or 40 matmuls queued first), ``--trials`` times, with random
data, in a fresh interpreter plain and under ``UMP_ALLOC=1``, and prints how many copies came
out wrong:

- ``torch``: ``torch.from_numpy(tmp).cuda(non_blocking=True)``, ``tmp`` dropped at once and a
  new array of its size filled with -1 (ump-alloc keeps the source until the copy ran);
- ``torch_d2h``: ``torch.from_numpy(out).copy_(gpu, non_blocking=True)`` and ``out`` read without
  a synchronisation (not guarded: the call's own documentation asks for one);
- ``cupy``: ``cupy.asarray(view, order="F")`` of a non-contiguous view (CuPy's staging buffer);
- ``cupy_nopin``: the same with a pinned-memory allocator that gives nothing, so that CuPy sends
  a NumPy temporary it drops (ump-alloc makes the call blocking).

    python benches/archive/async_copy_probe.py [--trials 6] [--cases torch,torch_d2h,cupy,cupy_nopin]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CASES = ("torch", "torch_d2h", "cupy", "cupy_nopin")

WORKER = r'''
import sys
import numpy as np
case, trials = sys.argv[1], int(sys.argv[2])
x = np.random.default_rng().random(1 << 22)
wrong = 0
if case.startswith("torch"):
    import torch
    torch.zeros(1, device="cuda")  # the first use of the GPU
    gx = torch.from_numpy(x).cuda()
    for _ in range(trials):
        torch.cuda._sleep(int(3e8))
        if case == "torch":
            tmp = x.copy()
            g = torch.from_numpy(tmp).cuda(non_blocking=True)
            del tmp
            y = np.full(x.size, -1.0)
            torch.cuda.synchronize()
            wrong += not np.array_equal(g.cpu().numpy(), x)
        else:
            out = np.full(x.size, -1.0)
            torch.from_numpy(out).copy_(gx, non_blocking=True)
            wrong += not np.array_equal(out, x)
            torch.cuda.synchronize()
else:
    import cupy as cp
    k = cp.ones((4096, 4096), cp.float32)
    cp.cuda.Device().synchronize()
    if case == "cupy_nopin":
        cp.cuda.set_pinned_memory_allocator(lambda _: None)
    src = x.reshape(1024, -1)[:, ::2]
    for _ in range(trials):
        for _ in range(40):
            k @ k
        g = cp.asarray(src, order="F")
        y = np.full(src.size, -1.0)
        cp.cuda.Device().synchronize()
        wrong += not np.array_equal(cp.asnumpy(g), src)
print(wrong)
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=6)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
    from _benchutil import gpu_or_skip, ump_env

    cases = [c for c in args.cases.split(",") if c]
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"unknown cases {unknown}; the cases: {', '.join(CASES)}")
    gpu_or_skip(*sorted({"torch" if c.startswith("torch") else "cupy" for c in cases}))
    out = {}
    for case in cases:
        for label, settings in (("plain", {}), ("ump", {"UMP_ALLOC": "1"})):
            r = subprocess.run([sys.executable, "-c", WORKER, case, str(args.trials)], capture_output=True,
                               text=True, env=ump_env(settings), timeout=600)
            if r.returncode != 0:
                sys.exit(f"{case} {label} failed:\n{r.stdout}\n{r.stderr}")
            out.setdefault(case, {})[label] = f"{int(r.stdout.split()[-1])}/{args.trials} wrong"
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
