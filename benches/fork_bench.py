"""fork() with pinned NumPy memory (issue 20), side by side in one run: NumPy's own allocator
(``plain``), ump-alloc's pinned host side shared with children (``share``, the default,
``UMP_ALLOC_PINNED_FORK=share``) and copied into them (``copy``, the behaviour before issue 20).
Each (variant, size) runs in a fresh interpreter.

Parts (``--parts``):

- ``fork``: a NumPy array of 0.5, 2, 8 and 16 GiB (``--gib``), filled, then ``os.fork()``: the
  parent's fork time, and in the child its ``Private_Dirty`` (``/proc/self/smaps_rollup``) right
  after the fork, the time of its first read of the whole array and its ``Private_Dirty``
  after that. Also the NumPy speed on the memory (``a *= 3`` and ``a.sum()``, one pass each).
  Goals: child private dirty <= 64 MiB whatever the size; fork <= 10 ms + 5 ms per GiB.
- ``numpy``: NumPy's speed on the memory itself, with no fork: a float64 array of each size
  (``--gib``), filled, then ``--passes`` passes each of ``a *= 3`` and ``a.sum()``; ``--reps``
  fresh interpreters per variant, the variants interleaved (plain, share, copy, plain, ...) so
  that machine drift spreads over all of them. Reports the median pass over all processes and
  the ratio to ``copy`` (the pinned memory before issue 20) and to ``plain``, and each process's
  time to make the array (``np.empty`` + ``fill``: the pinned chunk is made, populated and
  registered then). Goal: ``share`` as fast as ``copy``.
- ``pool``: ``multiprocessing.Pool(8)`` (fork) mapping over a 4 GiB float32 array made in the
  parent (64 tasks, each sums its slice): wall time of pool + map + join, and the peak of the
  machine's used memory (MemTotal - MemAvailable, sampled every 5 ms by a separate process)
  above what was used before the array was made.

    python benches/fork_bench.py [--parts fork,pool,numpy] [--gib 0.5,2,8,16] [--variants plain,share,copy]
        [--reps 3] [--passes 10] [--before OLD_LIB] [--json out.json]

Needs a GPU for ``share`` and ``copy`` (pinned memory); without one it says so and exits.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# How both workers start: a GiB-sized array made and filled (timed: a pinned chunk is made,
# populated and registered then), and the kind of memory it got.
MAKE = r'''
import json, os, sys, time
import numpy as np

def make(gib, dtype, value):
    n = int(gib * 2**30) // 8
    t = time.perf_counter()
    a = np.empty(n, dtype)
    a.fill(value)
    made = time.perf_counter() - t
    kind = "plain"
    if "ump_alloc" in sys.modules:
        import ump_alloc
        kind = ump_alloc.identify(a).kind
    return a, n, made, kind
'''

FORK_WORKER = MAKE + r'''
def dirty():
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    return -1.0

gib, reps = float(sys.argv[1]), int(sys.argv[2])
a, n, make_s, kind = make(gib, np.int64, 3)
rule = None
if "ump_alloc" in sys.modules:
    import ump_alloc
    rule = ump_alloc.capabilities()["fork_shared"]
t = time.perf_counter(); a *= 3; mul_s = time.perf_counter() - t
t = time.perf_counter(); s = int(a.sum()); sum_s = time.perf_counter() - t
assert s == 9 * n
forks = []
for _ in range(reps):
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        d0 = dirty()
        t = time.perf_counter(); ok = int(a.sum()) == 9 * n; read_s = time.perf_counter() - t
        d1 = dirty()
        os.write(w, json.dumps([d0, read_s, d1, ok]).encode())
        os._exit(0)
    fork_ms = (time.perf_counter() - t0) * 1e3
    os.close(w)
    d0, read_s, d1, ok = json.loads(os.read(r, 4096))
    os.waitpid(pid, 0)
    os.close(r)
    forks.append({"fork_ms": fork_ms, "child_dirty_mib": d0, "child_read_s": read_s,
                  "child_dirty_after_read_mib": d1, "child_read_right": ok})
print(json.dumps({"kind": kind, "fork_shared": rule, "make_s": make_s, "mul_s": mul_s,
                  "sum_s": sum_s, "forks": forks}))
'''

NUMPY_WORKER = MAKE + r'''
gib, passes = float(sys.argv[1]), int(sys.argv[2])
a, n, make_s, kind = make(gib, np.float64, 1.0)
mul, tot = [], []
for _ in range(passes):
    t = time.perf_counter(); a *= 3; mul.append(time.perf_counter() - t)
    t = time.perf_counter(); float(a.sum()); tot.append(time.perf_counter() - t)
print(json.dumps({"kind": kind, "make_s": make_s, "mul_s": mul, "sum_s": tot}))
'''

POOL_WORKER = r'''
import json, multiprocessing as mp, os, sys, time
import numpy as np

DATA = None

def work(i):
    step = DATA.size // 64
    return float(DATA[i * step:(i + 1) * step].sum(dtype=np.float64))

if __name__ == "__main__":
    n = 4 * 2**30 // 4
    t = time.perf_counter()
    DATA = np.ones(n, np.float32)
    DATA[::7] = 2.0
    make_s = time.perf_counter() - t
    want = float(DATA.sum(dtype=np.float64))
    kind = "plain"
    if "ump_alloc" in sys.modules:
        import ump_alloc
        kind = ump_alloc.identify(DATA).kind
    print("ready", flush=True)
    sys.stdin.readline()          # the memory monitor has its baseline
    t = time.perf_counter()
    with mp.get_context("fork").Pool(8) as pool:
        got = sum(pool.map(work, range(64)))
    pool.join()
    wall = time.perf_counter() - t
    print(json.dumps({"kind": kind, "wall_s": wall, "make_s": make_s, "right": abs(got - want) < 1e-3 * want}))
'''

MONITOR = r'''
import sys, threading, time
def used():
    m = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            m[k] = int(v.split()[0]) * 1024
    return m["MemTotal"] - m["MemAvailable"]
peak = [used()]
stop = []
def sample():
    while not stop:
        peak[0] = max(peak[0], used())
        time.sleep(0.005)
th = threading.Thread(target=sample, daemon=True); th.start()
print(used(), flush=True)
sys.stdin.readline()
stop.append(1); th.join()
print(peak[0], flush=True)
'''

VARIANTS = {
    "plain": {},
    "share": {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "share"},
    "copy": {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "copy"},
}


def _env(variant: str) -> dict:
    from _benchutil import ump_env

    return ump_env(VARIANTS[variant])


def fork_part(variants, sizes, reps):
    rows = []
    for gib in sizes:
        for v in variants:
            print(f"fork: {v} {gib} GiB ...", file=sys.stderr, flush=True)
            r = subprocess.run([sys.executable, "-c", FORK_WORKER, str(gib), str(reps)], env=_env(v),
                               capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                rows.append({"variant": v, "gib": gib, "error": r.stderr[-2000:]})
                continue
            out = json.loads(r.stdout.strip().splitlines()[-1])
            rows.append({"variant": v, "gib": gib, **out})
    return rows


def numpy_part(variants, sizes, reps, passes):
    """NumPy passes over each variant's memory, ``reps`` processes per variant, interleaved."""
    rows = []
    for gib in sizes:
        got = {v: {"mul_s": [], "sum_s": [], "make_s": [], "kind": "?"} for v in variants}
        for rep in range(reps):
            for v in variants:
                print(f"numpy: {v} {gib} GiB, process {rep + 1}/{reps} ...", file=sys.stderr, flush=True)
                r = subprocess.run([sys.executable, "-c", NUMPY_WORKER, str(gib), str(passes)], env=_env(v),
                                   capture_output=True, text=True, timeout=1800)
                if r.returncode != 0:
                    got[v]["error"] = r.stderr[-2000:]
                    continue
                out = json.loads(r.stdout.strip().splitlines()[-1])
                got[v]["kind"] = out["kind"]
                got[v]["mul_s"] += out["mul_s"]
                got[v]["sum_s"] += out["sum_s"]
                got[v]["make_s"].append(out["make_s"])
        for v in variants:
            g = got[v]
            row = {"variant": v, "gib": gib, "kind": g["kind"], "passes": len(g["mul_s"])}
            if "error" in g or not g["mul_s"]:
                row["error"] = g.get("error", "no pass ran")
            else:
                row["mul_median_s"] = sorted(g["mul_s"])[len(g["mul_s"]) // 2]
                row["sum_median_s"] = sorted(g["sum_s"])[len(g["sum_s"]) // 2]
                row["mul_range_s"] = [min(g["mul_s"]), max(g["mul_s"])]
                row["sum_range_s"] = [min(g["sum_s"]), max(g["sum_s"])]
                row["make_s"] = g["make_s"]
            rows.append(row)
    return rows


def pool_part(variants):
    rows = []
    for v in variants:
        print(f"pool: {v} ...", file=sys.stderr, flush=True)
        mon = subprocess.Popen([sys.executable, "-c", MONITOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        base = int(mon.stdout.readline())
        w = subprocess.Popen([sys.executable, "-c", POOL_WORKER], env=_env(v), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
        assert w.stdout.readline().strip() == "ready"
        w.stdin.write("\n")
        w.stdin.flush()
        out = json.loads(w.stdout.readline())
        w.wait(timeout=600)
        mon.stdin.write("\n")
        mon.stdin.flush()
        peak = int(mon.stdout.readline())
        mon.wait()
        rows.append({"variant": v, **out, "peak_used_above_start_gib": (peak - base) / 2**30})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="fork,pool")
    ap.add_argument("--gib", default="0.5,2,8,16")
    ap.add_argument("--variants", default="plain,share,copy")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--passes", type=int, default=10, help="NumPy passes per process (part numpy)")
    ap.add_argument("--before", metavar="LIB", help="adds variant 'before': 'share' with this libump_alloc.so "
                    "(an earlier build, to compare side by side)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.before:
        VARIANTS["before"] = {**VARIANTS["share"], "UMP_ALLOC_LIBRARY": os.path.abspath(args.before)}
    from _benchutil import gpu_or_skip

    gpu_or_skip()
    variants = args.variants.split(",")
    parts = args.parts.split(",")
    result = {}
    if "fork" in parts:
        result["fork"] = fork_part(variants, [float(x) for x in args.gib.split(",")], args.reps)
        print(f"{'variant':<6} {'GiB':>5} {'kind':<10} {'fork ms (each)':<26} {'child dirty MiB':<18} "
              f"{'child read s':<13} {'dirty after read':<17} {'a*=3 s':>7} {'sum s':>6}")
        for row in result["fork"]:
            if "error" in row:
                print(f"{row['variant']:<6} {row['gib']:>5} error: {row['error'][-300:]}")
                continue
            f = row["forks"]

            def each(key, fmt):
                return " ".join(format(x[key], fmt) for x in f)

            print(f"{row['variant']:<6} {row['gib']:>5} {row['kind']:<10} {each('fork_ms', '.1f'):<26} "
                  f"{each('child_dirty_mib', '.0f'):<18} {each('child_read_s', '.2f'):<13} "
                  f"{each('child_dirty_after_read_mib', '.0f'):<17} {row['mul_s']:>7.3f} {row['sum_s']:>6.3f}"
                  + ("" if all(x["child_read_right"] for x in f) else "  CHILD READ WRONG DATA"))
    if "numpy" in parts:
        sizes = [float(x) for x in args.gib.split(",")]
        result["numpy"] = rows = numpy_part(variants, sizes, args.reps, args.passes)
        print(f"\nNumPy on the memory, no fork: median of {args.passes} passes x {args.reps} processes per variant "
              "[fastest-slowest pass]")
        for row in rows:
            if "error" in row:
                print(f"  {row['variant']:<6} {row['gib']:>5} GiB error: {row['error'][-300:]}")
                continue
            ref = {k: next((r for r in rows if r["variant"] == k and r["gib"] == row["gib"] and "error" not in r), None)
                   for k in ("copy", "plain")}
            rel = "".join(f"  {row['mul_median_s'] / r['mul_median_s']:.3f}x / {row['sum_median_s'] / r['sum_median_s']:.3f}x {k}"
                          for k, r in ref.items() if r is not None and r is not row)
            print(f"  {row['variant']:<6} {row['gib']:>5} GiB {row['kind']:<10} a*=3 {row['mul_median_s']:.3f} s "
                  f"[{row['mul_range_s'][0]:.3f}-{row['mul_range_s'][1]:.3f}]  sum {row['sum_median_s']:.3f} s "
                  f"[{row['sum_range_s'][0]:.3f}-{row['sum_range_s'][1]:.3f}]{rel}  made in "
                  + " ".join(f"{x:.2f}" for x in row["make_s"]) + " s")
    if "pool" in parts:
        result["pool"] = pool_part(variants)
        print("\nmultiprocessing.Pool(8), fork, over a 4 GiB array made in the parent:")
        for row in result["pool"]:
            print(f"  {row['variant']:<6} {row['kind']:<10} pool+map+join {row['wall_s']:.2f} s, peak used memory "
                  f"{row['peak_used_above_start_gib']:.2f} GiB above the start (array made in {row['make_s']:.1f} s)"
                  + ("" if row["right"] else "  WRONG RESULT"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
