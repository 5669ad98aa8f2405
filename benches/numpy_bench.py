"""NumPy on ump-alloc against NumPy's default allocator, small- and large-array workloads.

Each configuration runs in a fresh interpreter (the allocator is chosen per process), the
runs alternate, and each workload reports the median of its repetitions. Usage:

    python benches/numpy_bench.py [--reps 7] [--mode MODE] [--json out.json]

MODE is passed as UMP_ALLOC_MODE to the ump-alloc runs (default: auto).
"""

import argparse
import json
import os
import platform
import subprocess
import sys

# The workloads `python -m ump_alloc bench` runs too, as the same text.
from ump_alloc.bench import NUMPY_WORKLOADS

WORKER = r'''
import json, sys, time
import numpy as np
use_ump = sys.argv[1] == "ump"
if use_ump:
    import ump_alloc
    ump_alloc.enable(cupy=False, torch=False)
''' + NUMPY_WORKLOADS + r'''
out = {}
for name, fn in WORKLOADS:
    fn()  # warm-up
    t = time.perf_counter()
    r = fn()
    out[name] = time.perf_counter() - t
    out[name + "_check"] = r
if use_ump:
    out["mode"] = ump_alloc.mode()
print(json.dumps(out))
'''


def run(kind, mode):
    env = dict(os.environ)
    env.pop("UMP_ALLOC", None)
    if mode and kind == "ump":
        env["UMP_ALLOC_MODE"] = mode
    r = subprocess.run([sys.executable, "-c", WORKER, kind], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--mode", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    runs = {"default": [], "ump": []}
    for _ in range(args.reps):
        for kind in ("default", "ump"):
            runs[kind].append(run(kind, args.mode))
    names = ["small", "medium", "large", "resize"]
    med = {k: {n: sorted(r[n] for r in v)[len(v) // 2] for n in names} for k, v in runs.items()}
    for n in names:
        assert runs["default"][0][n + "_check"] == runs["ump"][0][n + "_check"], n
    mode = runs["ump"][0].get("mode")
    print(f"NumPy {__import__('numpy').__version__}, Python {platform.python_version()}, ump-alloc mode '{mode}', "
          f"median of {args.reps} runs each")
    print(f"{'workload':<10}{'default (s)':>14}{'ump-alloc (s)':>16}{'ratio':>9}")
    for n in names:
        d, u = med["default"][n], med["ump"][n]
        print(f"{n:<10}{d:>14.4f}{u:>16.4f}{u / d:>9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": mode, "median": med, "reps": args.reps}, f, indent=1)


if __name__ == "__main__":
    main()
