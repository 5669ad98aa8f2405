"""Which threads allocate NumPy arrays from ump-alloc, by mechanism, and what each costs.

NumPy keeps its memory handler in a context variable, and a thread starts from an empty
context (on NumPy's default handler), so a handler set in one thread does not reach others.
Mechanisms measured, each in a fresh interpreter:

- ``this-thread``: ``enable(threads=False)``: the calling thread's context only.
- ``inherit``: the same, with CPython 3.14's ``-X thread_inherit_context=1`` (threads started
  later copy their starter's context); skipped on older Pythons.
- ``dispatch``: ``enable()`` (``threads=True``): NumPy's default handler dispatches to ump-alloc.

For each: whether a thread made *before* enabling and one started *after* allocate from
ump-alloc, and the time of a small-array alloc+free (``np.empty(16)``) on the enabling thread
and on the thread made before (CPU time of that thread), ``default`` being NumPy's own
allocator. Runs alternate; the table shows medians and the spread (min-max) over ``--reps``
runs.

    python benches/numpy_threads_bench.py [--reps 7] [--n 200000] [--python CMD] [--json out.json]

``--python``: the interpreter the workers run (default: this one), e.g. a wrapper script that
starts another CPython.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import json, sys, threading, time, queue
mech, n = sys.argv[1], int(sys.argv[2])
jobs, done = queue.Queue(), queue.Queue()
def serve():
    while True:
        f = jobs.get()
        if f is None:
            return
        done.put(f())
early = threading.Thread(target=serve, daemon=True)
early.start()
import numpy as np, ump_alloc
def loop():
    e = np.empty
    t = time.thread_time()  # this thread's CPU time: other processes' load does not count
    for _ in range(n):
        e(16)
    return (time.thread_time() - t) / n * 1e9
def on_early(f):
    jobs.put(f)
    return done.get()
if mech != "default":
    ump_alloc.enable(cupy=False, torch=False, threads=(mech == "dispatch"))
late = queue.Queue()
threading.Thread(target=lambda: late.put(ump_alloc.handles(np.ones(8))), daemon=True).start()
out = {
    "early": on_early(lambda: ump_alloc.handles(np.ones(8))),
    "late": late.get(),
    "main_ns": loop(),
    "early_ns": on_early(loop),
}
print(json.dumps(out))
'''


def run(mech: str, n: int, python: list) -> dict:
    args = list(python)
    if mech == "inherit":
        args += ["-X", "thread_inherit_context=1"]
    from _benchutil import ump_env

    env = ump_env({"UMP_ALLOC_NO_CUDA": os.environ.get("UMP_ALLOC_NO_CUDA", "0")})
    r = subprocess.run(args + ["-c", WORKER, mech, str(n)], capture_output=True, text=True, env=env, check=True)
    return json.loads(r.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--python", help="interpreter command for the workers (default: this one)")
    p.add_argument("--json")
    a = p.parse_args()
    mechs = ["default", "this-thread", "dispatch"]
    python = a.python.split() if a.python else [sys.executable]
    version = subprocess.run([*python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True, check=True).stdout.strip()
    if tuple(map(int, version.split(".")[:2])) >= (3, 14):
        mechs.insert(2, "inherit")
    runs: dict = {m: [] for m in mechs}
    for _ in range(a.reps):
        for m in mechs:  # alternate, so that drifts hit every mechanism alike
            runs[m].append(run(m, a.n, python))
    print(f"Python {version}, NumPy handler threads; {a.reps} runs of {a.n} np.empty(16) each")
    print(f"{'mechanism':<12} {'thread before':<14} {'thread after':<13} {'enabling thread ns':<24} {'thread before ns':<22}")
    summary = {}
    for m in mechs:
        rs = runs[m]
        row = {
            "early": all(r["early"] for r in rs),
            "late": all(r["late"] for r in rs),
            "main_ns": statistics.median(r["main_ns"] for r in rs),
            "early_ns": statistics.median(r["early_ns"] for r in rs),
            "main_spread": (min(r["main_ns"] for r in rs), max(r["main_ns"] for r in rs)),
            "early_spread": (min(r["early_ns"] for r in rs), max(r["early_ns"] for r in rs)),
        }
        summary[m] = row
        yes = {True: "ump-alloc", False: "NumPy's"}
        print(
            f"{m:<12} {yes[row['early']]:<14} {yes[row['late']]:<13} "
            f"{row['main_ns']:6.1f} ({row['main_spread'][0]:.1f}-{row['main_spread'][1]:.1f}){'':<6} "
            f"{row['early_ns']:6.1f} ({row['early_spread'][0]:.1f}-{row['early_spread'][1]:.1f})"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"python": version, "reps": a.reps, "n": a.n, "runs": runs, "summary": summary}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
