"""An unchanged NumPy -> GPU -> NumPy program, with and without ump-alloc (issue 10), and the
same program written with ump-alloc's explicit calls (issue 22).

The CuPy pipeline: NumPy pre-processing of a 256 MiB float32 array, ``cupy.asarray``, three
kernels, ``cupy.asnumpy``, and a host read of the result. Its PyTorch twin does the same with
``torch.from_numpy(h).cuda()`` and ``.cpu().numpy()``. The program text is the same in every
configuration; only the environment differs (``UMP_ALLOC=1``, and ``UMP_ALLOC_MODE``). Each
configuration runs in a fresh interpreter; the table shows the median time per iteration, with
the fastest and slowest iteration.

``--programs`` adds the explicit program: ``ump_alloc.asarray(h, like=...)`` and
``ump_alloc.asnumpy(...)`` in place of the library's copies (``explicit``: as they choose;
``explicit-view``: with ``copy=False``, the views they made before issue 22). ``--read full``
reads every element of the result (``r.sum()``) instead of one per 4 KiB page.

Also measured: ``cupy.asarray(numpy_array)`` and ``cupy.asnumpy(x)`` of 1 GiB (GB/s).

    python benches/pipeline_bench.py [--mib 256] [--iters 12] [--passes 1] [--configs default,auto,managed]
    python benches/pipeline_bench.py --configs default,auto --programs unchanged,explicit,explicit-view

A configuration may add settings: ``auto+CUPY_ZERO_COPY=1`` runs with UMP_ALLOC_CUPY_ZERO_COPY=1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

WORKER = r'''
import json, sys, time
import numpy as np
lib, mib, iters, passes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
program, read = sys.argv[5], sys.argv[6]
n = mib * 2**20 // 4
rng = np.random.default_rng(0)
raw = rng.random(n, dtype=np.float32)
out = {}
if read == "full":
    def host_read(r):
        return float(r.sum())                    # every element
else:
    def host_read(r):
        return float(r[:: 1024].sum())           # one element per 4 KiB page
if program != "unchanged":
    import ump_alloc
    COPY = None if program == "explicit" else False
if lib == "cupy":
    import cupy as cp
    if program == "unchanged":
        to_gpu, to_host = cp.asarray, cp.asnumpy
    else:
        to_gpu = lambda h: ump_alloc.asarray(h, like="cupy", copy=COPY)
        to_host = lambda g: ump_alloc.asnumpy(g, copy=COPY)
    def step():
        h = raw * 0.5 + 1.0                      # NumPy pre-processing (a new array)
        g = to_gpu(h)                             # to the GPU
        g = cp.sqrt(g); g *= 3.0; g += 1.0        # three kernels
        for _ in range(passes - 1):               # a multi-pass workload reads it again
            g *= 1.0001; g += 1.0
        r = to_host(g)                            # back to NumPy
        return host_read(r)                       # the host reads the result
    sync = cp.cuda.Device().synchronize
else:
    import torch
    if program == "unchanged":
        to_gpu = lambda h: torch.from_numpy(h).cuda()
        to_host = lambda t: t.cpu().numpy()
    else:
        to_gpu = lambda h: ump_alloc.asarray(h, like="torch", copy=COPY)
        to_host = lambda t: ump_alloc.asnumpy(t, copy=COPY)
    def step():
        h = raw * 0.5 + 1.0
        t = to_gpu(h)
        t = torch.sqrt(t); t *= 3.0; t += 1.0
        for _ in range(passes - 1):
            t *= 1.0001; t += 1.0
        r = to_host(t)
        return host_read(r)
    sync = torch.cuda.synchronize
check = step(); step(); sync()
ts = []
for _ in range(iters):
    t = time.perf_counter(); step(); sync(); ts.append(time.perf_counter() - t)
ts.sort()
out["ms"] = ts[len(ts) // 2] * 1e3
out["ms_min"], out["ms_max"] = ts[0] * 1e3, ts[-1] * 1e3
out["runs_ms"] = [x * 1e3 for x in ts]
out["check"] = check
if lib == "cupy":
    big = np.ones(2**30 // 4, np.float32)
    cp.asarray(big); sync()
    t = time.perf_counter(); g = cp.asarray(big); sync(); up = time.perf_counter() - t
    cp.asnumpy(g); sync()
    t = time.perf_counter(); back = cp.asnumpy(g); dn = time.perf_counter() - t
    out["asarray_1gib_gbs"] = 2**30 / up / 1e9
    out["asnumpy_1gib_gbs"] = 2**30 / dn / 1e9
    assert back[12345] == 1.0
try:
    import ump_alloc
    out["mode"] = ump_alloc.mode() if ump_alloc.is_enabled() else "off"
    if out["mode"] != "off":
        out["host_kind"] = ump_alloc.identify(raw).kind
except ImportError:
    out["mode"] = "off"
print(json.dumps(out))
'''


PROGRAMS = ("unchanged", "explicit", "explicit-view")


def run(config: str, lib: str, mib: int, iters: int, passes: int = 1, program: str = "unchanged",
        read: str = "strided") -> dict:
    """`config`: "default" (no ump-alloc), a mode ("auto", "managed", ...), optionally followed by
    "+NAME=VALUE" settings, e.g. "auto+CUPY_ZERO_COPY=1" sets UMP_ALLOC_CUPY_ZERO_COPY=1.
    `program`: one of PROGRAMS; `read`: "strided" (one element per 4 KiB page) or "full"."""
    if program not in PROGRAMS:
        raise ValueError(f"program must be one of {PROGRAMS}, not {program!r}")
    from _benchutil import ump_env

    env = ump_env({})
    mode, *settings = config.split("+")
    if mode != "default":
        env["UMP_ALLOC"] = "1"
        if mode != "auto":
            env["UMP_ALLOC_MODE"] = mode
    for kv in settings:
        k, _, v = kv.partition("=")
        env[f"UMP_ALLOC_{k}"] = v
    r = subprocess.run([sys.executable, "-c", WORKER, lib, str(mib), str(iters), str(passes), program, read],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--iters", type=int, default=12)
    p.add_argument("--configs", default="default,auto,managed")
    p.add_argument("--programs", default="unchanged",
                   help="comma-separated: unchanged, explicit, explicit-view (the last two under ump-alloc only)")
    p.add_argument("--read", choices=("strided", "full"), default="strided")
    p.add_argument("--libs", default="cupy,torch")
    p.add_argument("--passes", type=int, default=1, help="extra kernel passes over the array (multi-pass workload)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import _benchutil

    _benchutil.gpu_or_skip()
    programs = args.programs.split(",")
    runs = [(c, "unchanged") for c in args.configs.split(",")]
    runs += [(c, prog) for c in args.configs.split(",") if c != "default" for prog in programs if prog != "unchanged"]
    results = {}
    for lib in args.libs.split(","):
        for c, prog in runs:
            results[(lib, c, prog)] = run(c, lib, args.mib, args.iters, args.passes, prog, args.read)
            print(f"  {lib:<6} {c:<10} {prog:<14} {results[(lib, c, prog)]}", file=sys.stderr, flush=True)
    print(f"{args.mib} MiB pipeline ({args.passes} pass(es) of kernels, {args.read} host read), median ms per "
          f"iteration of {args.iters} [fastest-slowest] (speed-up over 'default')")
    for lib in args.libs.split(","):
        base = results.get((lib, "default", "unchanged"), {}).get("ms")
        for c, prog in runs:
            r = results[(lib, c, prog)]
            if "error" in r:
                print(f"  {lib:<6} {c:<10} {prog:<14} error: {r['error']}")
                continue
            sp = f"{base / r['ms']:.2f}x" if base else "-"
            extra = ""
            if "asarray_1gib_gbs" in r:
                extra = f"   asarray 1 GiB {r['asarray_1gib_gbs']:.1f} GB/s, asnumpy 1 GiB {r['asnumpy_1gib_gbs']:.1f} GB/s"
            spread = f"[{r['ms_min']:.1f}-{r['ms_max']:.1f}]"
            print(f"  {lib:<6} {c:<10} {prog:<14} {r['ms']:8.1f} ms {spread:>15} {sp:>6}  mode {r['mode']:<8}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k[0]}/{k[1]}/{k[2]}": v for k, v in results.items()}, f, indent=1)


if __name__ == "__main__":
    main()
