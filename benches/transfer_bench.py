"""Issue 22's benchmarks side by side in one run: explicit transfers (ump_alloc.asarray /
asnumpy) that pick the faster of a view and a DMA copy, against what they replace.

1. pipeline: the NumPy -> GPU -> NumPy program of benches/pipeline_bench.py (256 MiB, three
   kernels, a host read of the result), CuPy and PyTorch, each variant in a fresh interpreter:
   plain (no ump-alloc), unchanged under UMP_ALLOC=1, explicit (ump_alloc.asarray / asnumpy as
   they choose) and explicit-view (copy=False: the views they made before issue 22). Goals:
   explicit at least as fast as unchanged, which is at least 2.4x (CuPy) / 4.5x (PyTorch) plain.
2. d2h: 1 GiB written by a kernel, then a host read of every element (zero_copy_bench.py d2h,
   in a fresh process): asnumpy at least as fast as a DMA copy into pinned memory + the read.
3. sparse: the host reads 1 % of a 1 GiB GPU array (and 5, 20, 50 %, to see where the plan's
   threshold falls; zero_copy_bench.py sparse, fresh process): the view asnumpy(touch=0.01)
   makes ahead of every copy.
4. h2d: kernels read 1 %-300 % of a pinned 1 GiB NumPy array (zero_copy_bench.py h2d, fresh
   process): where the to-device threshold falls.

    python benches/transfer_bench.py                  # everything, tables and a summary
    python benches/transfer_bench.py --repeat 3 --json transfer.json
    python benches/transfer_bench.py --only pipeline --read full

The pipeline's variants run --repeat times each, interleaved (plain, unchanged, explicit,
explicit-view, plain, ...), so that machine drift spreads over all of them; the summary gives the
median of the per-process medians with the fastest and slowest process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# (label, pipeline_bench configuration, program)
PIPELINE = [
    ("plain", "default", "unchanged"),
    ("unchanged, UMP_ALLOC=1", "auto", "unchanged"),
    ("explicit asarray/asnumpy", "auto", "explicit"),
    ("explicit, copy=False (views)", "auto", "explicit-view"),
]
GOAL_OVER_PLAIN = {"cupy": 2.4, "torch": 4.5}


def _env():
    from _benchutil import ump_env

    return ump_env({})


def pipeline(repeat: int, mib: int, iters: int, read: str) -> dict:
    import pipeline_bench

    per = {(lib, label): [] for lib in GOAL_OVER_PLAIN for label, _, _ in PIPELINE}
    for rep in range(repeat):
        for lib in GOAL_OVER_PLAIN:
            for label, config, program in PIPELINE:
                r = pipeline_bench.run(config, lib, mib, iters, 1, program, read)
                print(f"  [{rep + 1}/{repeat}] {lib:<6} {label:<30} {r.get('ms', r.get('error'))}", file=sys.stderr,
                      flush=True)
                per[(lib, label)].append(r)
    print(f"\n== pipeline: {mib} MiB, {iters} iterations per process, {read} host read, {repeat} process(es) per "
          "variant; ms per iteration: median of the process medians [fastest-slowest process]")
    summary = {}
    for lib in GOAL_OVER_PLAIN:
        meds = {}
        for label, _, _ in PIPELINE:
            runs = per[(lib, label)]
            errors = [r["error"] for r in runs if "error" in r]
            if errors:
                print(f"  {lib:<6} {label:<30} error: {errors[0]}")
                continue
            ms = [r["ms"] for r in runs]
            meds[label] = statistics.median(ms)
            within = f"within a process {min(r['ms_min'] for r in runs):.1f}-{max(r['ms_max'] for r in runs):.1f}"
            plain = meds.get("plain")
            sp = f"{plain / meds[label]:.2f}x plain" if plain else ""
            print(f"  {lib:<6} {label:<30} {meds[label]:8.1f} ms [{min(ms):.1f}-{max(ms):.1f}] {sp:>12}   ({within})")
        unchanged, explicit = meds.get("unchanged, UMP_ALLOC=1"), meds.get("explicit asarray/asnumpy")
        if unchanged and explicit and meds.get("plain"):
            print(f"  {lib:<6} explicit / unchanged speed: {unchanged / explicit:.3f} (goal >= 1); unchanged "
                  f"{meds['plain'] / unchanged:.2f}x plain (goal >= {GOAL_OVER_PLAIN[lib]}x)")
        summary[lib] = {"median_ms": meds, "runs": {label: per[(lib, label)] for label, _, _ in PIPELINE}}
    return summary


def zero_copy(command: str, gib: float, rounds: int | None) -> dict:
    """Run zero_copy_bench.py `command` in a fresh process; its table goes to stdout."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "out.json")
        cmd = [sys.executable, os.path.join(HERE, "zero_copy_bench.py"), command, "--gib", str(gib), "--json", path]
        if rounds is not None:
            cmd += ["--rounds", str(rounds)]
        print(f"\n== {command} (zero_copy_bench.py, a fresh process)", flush=True)
        r = subprocess.run(cmd, env=_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        print(r.stdout, end="")
        if r.returncode != 0 or not os.path.exists(path):
            tail = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
            print(f"  error: {tail}")
            return {"error": tail}
        with open(path) as f:
            return json.load(f)


def verdicts(results: dict) -> None:
    d2h = results.get("d2h", {}).get("rows")
    if d2h:
        mine = next(v for k, v in d2h.items() if k.startswith("asnumpy (its choice"))
        base = d2h["DMA copy into pinned memory (x.get(out=...))"]
        print(f"d2h: asnumpy {mine['median_ms']:.1f} ms against a DMA copy into pinned + read "
              f"{base['median_ms']:.1f} ms: speed ratio {base['median_ms'] / mine['median_ms']:.3f} (goal >= 1)")
    for label, case in results.get("sparse", {}).get("cases", {}).items():
        rows = case["rows"]
        hinted = next(v for k, v in rows.items() if k.startswith("asnumpy(touch="))
        copies = [v["median_ms"] for k, v in rows.items() if "copy" in k.lower() and "copy=False" not in k]
        print(f"sparse, {label}: asnumpy(touch={case['touch']:g}) ({case['plan']}) {hinted['median_ms']:.1f} ms; "
              f"fastest copy {min(copies):.1f} ms")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--only", default="pipeline,d2h,sparse,h2d", help="comma-separated parts")
    p.add_argument("--repeat", type=int, default=2, help="processes per pipeline variant")
    p.add_argument("--mib", type=int, default=256, help="pipeline array size")
    p.add_argument("--iters", type=int, default=8, help="pipeline iterations per process")
    p.add_argument("--read", choices=("strided", "full"), default="strided", help="pipeline host read")
    p.add_argument("--gib", type=float, default=1.0, help="d2h / sparse / h2d array size")
    p.add_argument("--rounds", type=int, default=None, help="d2h / sparse / h2d rounds per variant")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import _benchutil

    _benchutil.gpu_or_skip("cupy", "torch")
    parts = args.only.split(",")
    unknown = set(parts) - {"pipeline", "d2h", "sparse", "h2d"}
    if unknown:
        p.error(f"unknown parts: {sorted(unknown)}")
    results = {}
    if "pipeline" in parts:
        results["pipeline"] = pipeline(args.repeat, args.mib, args.iters, args.read)
    for part in ("d2h", "sparse", "h2d"):
        if part in parts:
            results[part] = zero_copy(part, args.gib, args.rounds)
    print()
    verdicts(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
