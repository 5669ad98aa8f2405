"""NumPy arrays that grow to 1 GiB, on ump-alloc against NumPy's default allocator, each in a
fresh process. Runs without a GPU too (ump-alloc's host side is then plain host memory).

    python3 benches/realloc_bench.py               # both allocators, table + JSON
    python3 benches/realloc_bench.py --gib 0.25

Loops, each to --gib (default 1):
- ndarray.resize: a.resize(n + step) in 16 MiB steps: NumPy reallocates the data (realloc).
  ump-alloc grows the block in place or moves its pages (never a copy; pinned memory is
  registered again as it grows); glibc's realloc moves the pages of its large blocks (mremap).
- np.fromiter over a generator (no length hint) of int64, to 1/16 of the size (it is bound
  by Python): NumPy grows its buffer by realloc as it goes, then shrinks it to the result.
- np.append in 64 MiB steps: a new array each time (np.concatenate), so every allocator copies
  the whole array every step; what differs is the cost of the allocations.

Reported: seconds per loop (median of --rounds), and for ump-alloc the bytes realloc copied
(stats()["realloc"]["copied_bytes"]: 0 means no realloc copied anything).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

MIB = 1 << 20


def loops(gib: float, rounds: int) -> dict:
    total = int(gib * (1 << 30))
    out: dict[str, list[float]] = {"resize": [], "fromiter": [], "append": []}
    copied: dict[str, int] = {}

    def realloc_copied() -> int:
        if os.environ.get("BENCH_UMP") != "1":
            return 0
        import ump_alloc

        return ump_alloc.stats()["realloc"]["copied_bytes"]

    for _ in range(rounds):
        c0 = realloc_copied()
        t0 = time.perf_counter()
        a = np.empty(0, dtype=np.uint8)
        n = 0
        while n < total:
            m = n + 16 * MIB
            a.resize(m, refcheck=False)
            a[n:m] = (n // MIB) & 0xFF  # touch the new part
            n = m
        out["resize"].append(time.perf_counter() - t0)
        assert a[5 * MIB] == 0 and a[-1] == ((n - 16 * MIB) // MIB) & 0xFF
        copied["resize"] = realloc_copied() - c0
        del a

        c0 = realloc_copied()
        t0 = time.perf_counter()
        count = total // 16 // 8
        b = np.fromiter((i for i in range(count)), dtype=np.int64)
        out["fromiter"].append(time.perf_counter() - t0)
        assert b[-1] == count - 1
        copied["fromiter"] = realloc_copied() - c0
        del b

        t0 = time.perf_counter()
        c = np.zeros(0, dtype=np.uint8)
        step = np.ones(64 * MIB, dtype=np.uint8)
        while c.nbytes < total:
            c = np.append(c, step)
        out["append"].append(time.perf_counter() - t0)
        del c, step
    return {"times": out, "realloc_copied_bytes": copied}


def run_in_child(ump: bool, gib: float, rounds: int) -> dict:
    from _benchutil import ump_env

    env = ump_env({"UMP_ALLOC": "1", "BENCH_UMP": "1"} if ump else {})
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--run", "--gib", str(gib), "--rounds", str(rounds)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"run failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="final size in GiB (default 1)")
    ap.add_argument("--rounds", type=int, default=3, help="repeats (default 3)")
    ap.add_argument("--run", action="store_true", help="run the loops in this process, print JSON")
    ap.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = ap.parse_args()
    if args.run:
        r = loops(args.gib, args.rounds)
        if os.environ.get("BENCH_UMP") == "1":
            import ump_alloc

            r["host_kind"] = ump_alloc.stats()["host_kind"]
            r["handled"] = ump_alloc.is_enabled()
        print(json.dumps(r))
        return
    print("[1/2] NumPy's default allocator ...", file=sys.stderr, flush=True)
    base = run_in_child(False, args.gib, args.rounds)
    print("[2/2] ump-alloc (UMP_ALLOC=1) ...", file=sys.stderr, flush=True)
    ump = run_in_child(True, args.gib, args.rounds)
    print(f"{args.gib:g} GiB, median of {args.rounds}; ump-alloc's host side: {ump.get('host_kind')}")
    print(f"{'loop':10} {'NumPy default':>14} {'ump-alloc':>10} {'realloc copied (ump)':>21}")
    for k in base["times"]:
        b, u = np.median(base["times"][k]), np.median(ump["times"][k])
        cb = ump["realloc_copied_bytes"].get(k)
        print(f"{k:10} {b:13.3f}s {u:9.3f}s {('-' if cb is None else f'{cb / MIB:.1f} MiB'):>21}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"numpy_default": base, "ump": ump}, f, indent=1)


if __name__ == "__main__":
    main()
