"""Many small NumPy arrays: time and peak memory, ump-alloc against NumPy's default allocator.

The workload keeps 2,000,000 small arrays alive (64 bytes of data each: 8 float64) and makes
2,000,000 short-lived ones alongside, as a program holding many small per-record arrays does.
Each configuration runs in a fresh interpreter; the runs alternate, and the table shows the
median time and the median peak resident set size (``ru_maxrss``) of each.

    python benches/small_arrays_bench.py [--reps 5] [--keep 2000000] [--mode MODE] [--json out.json]

MODE is passed as UMP_ALLOC_MODE to the ump-alloc runs (default: auto).

Goal (issue 9): ump-alloc within 1.05x the time and 1.1x the peak memory of the default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

WORKER = r'''
import json, resource, sys, time
import numpy as np
kind, keep_n = sys.argv[1], int(sys.argv[2])
if kind == "ump":
    import ump_alloc
    ump_alloc.enable(cupy=False, torch=False)
t = time.perf_counter()
keep = []
acc = 0.0
for i in range(keep_n):
    a = np.arange(8, dtype=np.float64)      # kept: 64 B of data
    keep.append(a)
    b = a * 2.0                             # short-lived: 64 B
    acc += b[1]
elapsed = time.perf_counter() - t
out = {"time": elapsed, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
       "check": acc, "arrays": len(keep)}
if kind == "ump":
    s = ump_alloc.stats()["host"]
    out["mapped_peak"] = s["mapped_peak"]
    out["in_use_peak"] = s["in_use_peak"]
    out["mode"] = ump_alloc.mode()
print(json.dumps(out))
'''


def run(kind: str, keep: int, mode: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop("UMP_ALLOC", None)
    if mode and kind == "ump":
        env["UMP_ALLOC_MODE"] = mode
    r = subprocess.run([sys.executable, "-c", WORKER, kind, str(keep)], capture_output=True,
                       text=True, env=env, check=True)
    return json.loads(r.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--keep", type=int, default=2_000_000)
    p.add_argument("--mode", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"default": [], "ump": []}
    for i in range(args.reps):
        for kind in ("default", "ump"):
            runs[kind].append(run(kind, args.keep, args.mode))
            print(f"  rep {i + 1}/{args.reps} {kind}: {runs[kind][-1]['time']:.3f} s", file=sys.stderr)
    assert runs["default"][0]["check"] == runs["ump"][0]["check"]
    med = {k: {"time": statistics.median(r["time"] for r in v),
               "maxrss_mib": statistics.median(r["maxrss_kib"] for r in v) / 1024}
           for k, v in runs.items()}
    u = runs["ump"][0]
    print(f"Python {platform.python_version()}, NumPy {__import__('numpy').__version__}, ump-alloc mode "
          f"'{u['mode']}', {args.keep:,} kept + {args.keep:,} short-lived arrays, median of {args.reps}")
    print(f"{'':<12}{'default':>12}{'ump-alloc':>12}{'ratio':>9}")
    for key, unit in (("time", "s"), ("maxrss_mib", "MiB")):
        d, x = med["default"][key], med["ump"][key]
        print(f"{key + ' (' + unit + ')':<18}{d:>6.2f}{x:>12.2f}{x / d:>9.3f}")
    print(f"ump-alloc host side: in_use_peak {u['in_use_peak'] / 2**20:.0f} MiB, "
          f"mapped_peak {u['mapped_peak'] / 2**20:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median": med, "runs": runs, "reps": args.reps}, f, indent=1)


if __name__ == "__main__":
    main()
