"""Many small NumPy arrays: time and peak memory, ump-alloc against NumPy's default allocator.

Two workloads keep N small arrays alive (64 bytes of data each) and make short-lived ones
alongside, as a program holding many small per-record arrays does:

- ``kept``: ``a = np.arange(8, dtype=np.float64)`` kept, ``b = a * 2.0`` (issue 9);
- ``plus``: ``a = np.arange(8) + i`` kept (the arange is short-lived), ``b = a * 2.0`` (issue 21).

Each run is a fresh interpreter; the runs alternate, and the table shows the medians of the
loop's wall time, its CPU time (user + system: steadier on a shared machine) and the peak
resident set size (``ru_maxrss``), and the median of the per-pair ratios. ump-alloc is switched
on with ``UMP_ALLOC=1`` (the import hook, or ``enable()`` inside a function where the hook is
not installed), so both programs are the same text with the same global names, and ``PYTHONHASHSEED=0`` and ``OPENBLAS_NUM_THREADS=1`` keep the interpreter's dict
layouts and NumPy's BLAS threads alike in both.

    python benches/small_arrays_bench.py [--reps 5] [--keep 1000000] [--workload plus]
        [--mode MODE] [--json out.json]

MODE is passed as UMP_ALLOC_MODE to the ump-alloc runs (default: auto).

Goal (issues 9 and 21): ump-alloc within 1.05x the time and 1.1x the peak memory of the default.
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
import json, os, resource, sys, time
import numpy as np
def switch_on():
    # Where the import hook is not installed (PYTHONPATH=python on the GPU machine); inside a
    # function, so that the program's global names stay those of the default run.
    import ump_alloc
    ump_alloc.enable(cupy=False, torch=False)
if os.environ.get("UMP_ALLOC") == "1" and (getattr(np, "_core", None) or np.core).multiarray.get_handler_name() != "ump_alloc":
    switch_on()
workload, keep_n = sys.argv[1], int(sys.argv[2])
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
keep = []
acc = 0.0
c = cpu()
t = time.perf_counter()
if workload == "kept":
    for i in range(keep_n):
        a = np.arange(8, dtype=np.float64)      # kept: 64 B of data
        keep.append(a)
        b = a * 2.0                             # short-lived: 64 B
        acc += b[1]
else:
    for i in range(keep_n):
        a = np.arange(8) + i                    # kept; the arange is short-lived
        keep.append(a)
        b = a * 2.0                             # short-lived
        acc += b[1]
elapsed = time.perf_counter() - t
c = cpu() - c
out = {"time": elapsed, "cpu": c, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
       "check": acc, "arrays": len(keep), "handler": (getattr(np, "_core", None) or np.core).multiarray.get_handler_name(a),
       # ump-alloc's NumPy dispatch keeps the default handler's name: ask whose the memory is.
       "ours": "ump_alloc" in sys.modules and sys.modules["ump_alloc"].handles(a)}
if out["handler"] == "ump_alloc":
    import ump_alloc
    s = ump_alloc.stats()["host"]
    out["mapped_peak"] = s["mapped_peak"]
    out["in_use_peak"] = s["in_use_peak"]
    out["mode"] = ump_alloc.mode()
print(json.dumps(out))
'''


def run(kind: str, keep: int, workload: str, mode: str | None = None) -> dict:
    env = dict(os.environ, PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1",
               UMP_ALLOC="1" if kind == "ump" else "0")
    if mode and kind == "ump":
        env["UMP_ALLOC_MODE"] = mode
    r = subprocess.run([sys.executable, "-c", WORKER, workload, str(keep)], capture_output=True,
                       text=True, env=env, check=True)
    out = json.loads(r.stdout)
    want = "ump_alloc" if kind == "ump" else "default_allocator"
    if out["handler"] != want or out["ours"] != (kind == "ump"):
        raise SystemExit(f"the {kind} run used NumPy's {out['handler']} handler (ump-alloc's memory: "
                         f"{out['ours']}), not {want}")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--keep", type=int, default=2_000_000)
    p.add_argument("--workload", choices=("kept", "plus"), default="kept")
    p.add_argument("--mode", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    runs: dict[str, list[dict]] = {"default": [], "ump": []}
    for i in range(args.reps):
        for kind in ("default", "ump"):
            runs[kind].append(run(kind, args.keep, args.workload, args.mode))
            r = runs[kind][-1]
            print(f"  rep {i + 1}/{args.reps} {kind}: {r['time']:.3f} s, cpu {r['cpu']:.3f} s",
                  file=sys.stderr)
    assert runs["default"][0]["check"] == runs["ump"][0]["check"]
    keys = (("time", "s"), ("cpu", "s"), ("maxrss_mib", "MiB"))
    for v in runs.values():
        for r in v:
            r["maxrss_mib"] = r["maxrss_kib"] / 1024
    med = {k: {key: statistics.median(r[key] for r in v) for key, _ in keys}
           for k, v in runs.items()}
    pair = {key: statistics.median(u[key] / d[key] for u, d in zip(runs["ump"], runs["default"]))
            for key, _ in keys}
    u = runs["ump"][0]
    print(f"Python {platform.python_version()}, NumPy {__import__('numpy').__version__}, ump-alloc mode "
          f"'{u['mode']}', workload '{args.workload}', {args.keep:,} kept + short-lived arrays, "
          f"median of {args.reps}")
    print(f"{'':<18}{'default':>10}{'ump-alloc':>12}{'ratio':>9}{'pairs':>9}")
    for key, unit in keys:
        d, x = med["default"][key], med["ump"][key]
        print(f"{key + ' (' + unit + ')':<18}{d:>10.2f}{x:>12.2f}{x / d:>9.3f}{pair[key]:>9.3f}")
    print(f"ump-alloc host side: in_use_peak {u['in_use_peak'] / 2**20:.0f} MiB, "
          f"mapped_peak {u['mapped_peak'] / 2**20:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median": med, "pairs": pair, "runs": runs, "reps": args.reps}, f, indent=1)


if __name__ == "__main__":
    main()
