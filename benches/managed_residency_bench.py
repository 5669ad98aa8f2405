"""Managed memory on the device side: how fast the host gets at GPU-written data, and what
reusing a block the host read costs. Each configuration runs in a fresh process.

    python3 benches/managed_residency_bench.py            # both parts, table + JSON
    python3 benches/managed_residency_bench.py --gib 0.5 --rounds 3

1. asnumpy + host read: a kernel writes 1 GiB of random uint64 on the managed device side
   (CuPy on ump-alloc, mode auto), then the host reads every element (a sum). Timed from the
   end of the kernel to the end of the read:
   - view: ump_alloc.asnumpy(x, copy=False), a NumPy view; its pages migrate in the
     background while the host reads (ump-alloc's view; by default asnumpy copies here since
     issue 22, see transfer_bench.py);
   - prefetch, then read: the range prefetched to the host and waited for first (the path
     before this change, through the driver directly);
   - fault: the view read with no prefetch at all;
   - copy into pinned: cupy.asnumpy into a NumPy array (pinned host side) at DMA speed, then
     the read.
2. reuse of a block the host used: the host reads and writes every element of a GPU-written
   block (asnumpy, then +=), the block is freed, and a kernel writes a new block of the same
   size right away (it gets the same memory). Timed: the allocation and the kernel, synchronised. UMP_ALLOC_MANAGED_DISCARD=1
   (discard the freed block, discard-and-prefetch it when reused) against 0 (the dead pages
   migrate back on the kernel's first touch).

The oversubscription run the issue describes (managed memory at 1.5x the GPU's) is not made:
the lent machines' rules forbid asking for more managed memory than the card has free.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _prefetch_to_host(ptr: int, size: int) -> None:
    """cuMemPrefetchAsync_v2 to the host on the legacy stream, then wait."""
    cu = ctypes.CDLL("libcuda.so.1")

    class Loc(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    f = cu.cuMemPrefetchAsync_v2
    f.argtypes = [ctypes.c_uint64, ctypes.c_size_t, Loc, ctypes.c_uint, ctypes.c_void_p]
    assert f(ptr, size, Loc(2, 0), 0, None) == 0  # CU_MEM_LOCATION_TYPE_HOST
    assert cu.cuStreamSynchronize(None) == 0


def read_run(gib: float, rounds: int) -> dict:
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = int(gib * (1 << 30)) // 8
    out: dict[str, list[float]] = {"view": [], "prefetch, then read": [], "fault": [], "copy into pinned": []}
    for r in range(rounds):
        for how in out:
            x = cp.random.randint(0, 2**62, size=n, dtype=cp.int64).view(cp.uint64)
            expect = int(cp.sum(x, dtype=cp.uint64).get())  # wraps like NumPy's
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            if how == "view":
                h = ump_alloc.asnumpy(x, copy=False)
            elif how == "copy into pinned":
                h = cp.asnumpy(x)
            else:
                if how == "prefetch, then read":
                    _prefetch_to_host(x.data.ptr, x.nbytes)
                buf = (ctypes.c_uint64 * n).from_address(x.data.ptr)
                h = np.ctypeslib.as_array(buf)
            got = int(h.sum(dtype=np.uint64))
            dt = time.perf_counter() - t0
            assert got == expect, (how, got, expect)
            out[how].append(dt)
            del h, x
    return {"mode": ump_alloc.mode(), "bytes": n * 8, "times": out}


def reuse_run(gib: float, rounds: int) -> dict:
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = int(gib * (1 << 30)) // 8
    times, same = [], 0
    for r in range(rounds + 1):
        x = cp.empty(n, dtype=cp.int64)
        x.fill(7 + r)  # no other block of this size: the next one gets the same memory
        ptr = x.data.ptr
        h = ump_alloc.asnumpy(x, copy=False)
        h += 1  # the host reads and writes it all: its pages are the host's now
        del h, x
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        y = cp.empty(n, dtype=cp.int64)
        y.fill(r + 1)
        cp.cuda.Device().synchronize()
        dt = time.perf_counter() - t0
        assert int(y[-1]) == r + 1
        same += y.data.ptr == ptr
        del y
        if r:  # the first round warms up the kernel
            times.append(dt)
    return {"discarded": ump_alloc.stats()["devices"][0]["discarded"], "times": times, "same_block": same}


def child(part: str, env: dict, gib: float, rounds: int) -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC_") or k == "UMP_ALLOC_LIBRARY"}
    e.update(env)
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--part", part, "--gib", str(gib), "--rounds", str(rounds)],
        env=e, capture_output=True, text=True, timeout=600,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{part} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="GiB per array (default 1)")
    ap.add_argument("--rounds", type=int, default=5, help="repeats per variant (default 5)")
    ap.add_argument("--part", choices=["read", "reuse"], help="run one part in this process, print JSON")
    ap.add_argument("--json", metavar="FILE", help="also write the results to FILE")
    args = ap.parse_args()
    if args.part == "read":
        print(json.dumps(read_run(args.gib, args.rounds)))
        return
    if args.part == "reuse":
        print(json.dumps(reuse_run(args.gib, args.rounds)))
        return
    from _benchutil import gpu_or_skip

    gpu_or_skip("cupy")
    print("[1/3] asnumpy + host read ...", file=sys.stderr, flush=True)
    read = child("read", {}, args.gib, args.rounds)
    print("[2/3] reuse, discard on ...", file=sys.stderr, flush=True)
    on = child("reuse", {"UMP_ALLOC_MANAGED_DISCARD": "1"}, args.gib, args.rounds)
    print("[3/3] reuse, discard off ...", file=sys.stderr, flush=True)
    off = child("reuse", {"UMP_ALLOC_MANAGED_DISCARD": "0"}, args.gib, args.rounds)
    gib = read["bytes"] / 2**30
    print(f"1. {gib:.2f} GiB written by a kernel, then a host read of every element (mode {read['mode']}), ms:")
    for how, ts in read["times"].items():
        print(f"   {how:22} median {1e3 * np.median(ts):7.1f}  min {1e3 * min(ts):7.1f}")
    print(f"2. reuse of a {gib:.2f} GiB block the host read and wrote: allocation + kernel write, ms:")
    for name, r in [("discard (default)", on), ("no discard", off)]:
        print(f"   {name:22} median {1e3 * np.median(r['times']):7.1f}  min {1e3 * min(r['times']):7.1f}"
              f"  ({r['discarded'] >> 20} MiB discarded; same block {r['same_block']}/{args.rounds + 1})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read": read, "reuse_discard": on, "reuse_no_discard": off}, f, indent=1)


if __name__ == "__main__":
    main()
