"""``python -m ump_alloc bench``: ump-alloc against the default allocators, on this machine.

Every measurement runs in fresh interpreters with the same program text, once with the default
allocators and once with ``UMP_ALLOC=1`` per round, for several rounds (7; 5 with ``--quick``);
the two settings alternate, and which goes first alternates from round to round, so that drift
on a busy machine hits both alike. Each row shows the median of the rounds and their spread
(lowest-highest). A verdict ("ump-alloc 1.35x faster") is given only where every round of one
setting beat every round of the other; otherwise the row says "same within noise".

The workloads do what programs do with their memory: every array is written and read.

- NumPy: the four workloads of ``benches/numpy_bench.py`` (it imports them from here): many small arrays
  (arange, ufuncs, concatenate, sum), 2,000 arrays of 160 KB, 32 MiB arrays (zeros, ``+=``,
  ``empty_like``, multiply, sum), and a growing ``np.append``. These are loops that do little
  but allocate (marked ``*``): they show the allocator's own cost, not what a program gains.
- Whole programs: a NumPy program of big temporaries (a 1,000,000 x 7 table through ufunc
  expressions, a cumulative sum, then rounds of concatenate, sort and mean) and, where pandas
  is installed, a pandas program (groupby, merge, sort, pivot table). Each row gives the
  program's time, the whole process's time (interpreter start-up included) and its peak
  memory (``ru_maxrss``): read these for what a program gains, or loses.
- CuPy (GPU): ``cupy.asarray`` and ``cupy.asnumpy`` of 256 MiB (copies: every byte moves); a
  GPU result read by NumPy (a kernel writes it, then ``ump_alloc.asnumpy`` and a read of every
  element: a view under ump-alloc, a copy without; ``benches/zero_copy_bench.py transfer``'s
  end-to-end column); the NumPy -> GPU -> NumPy step of ``benches/pipeline_bench.py``; CuPy
  alloc+free latency of 4 KiB and 1 MiB (``benches/cupy_alloc_bench.py``'s loop).
- PyTorch (GPU): ``torch.empty`` + free latency of 4 KiB and 1 MiB, and ``.cpu()`` of 256 MiB
  (``benches/torch_transfer_bench.py``).

Without a GPU (or without CuPy / PyTorch) only what can run is measured, and the table says why
the rest is missing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Iterable

#: The NumPy workloads, shared with ``benches/numpy_bench.py`` so that both report the same
#: thing. Each returns a checksum (the same under both allocators).
NUMPY_WORKLOADS = r'''
def small():
    # Typical small-array Python code: many short-lived arrays of 8 B .. 8 KiB.
    acc = 0.0
    for i in range(20000):
        a = np.arange(i % 64 + 1, dtype=np.float64)
        b = a * 2.0 + 1.0
        c = np.sqrt(b)
        d = np.concatenate((c, a[:3]))
        acc += float(d.sum())
    return acc

def medium():
    acc = 0.0
    for i in range(2000):
        a = np.ones(20000 + i)
        b = np.exp(a * 0.5)
        acc += float(b[-1])
    return acc

def large():
    acc = 0.0
    for i in range(6):
        a = np.zeros(32 * 2**20 // 8)        # 32 MiB calloc
        a += 1.0
        b = np.empty_like(a)                 # 32 MiB malloc
        np.multiply(a, 3.0, out=b)
        acc += float(b[::4096].sum())
    return acc

def resize():
    a = np.zeros(0)
    for i in range(3000):
        a = np.append(a, i)                  # realloc-style growth
    return float(a.sum())

WORKLOADS = [("small", small), ("medium", medium), ("large", large), ("resize", resize)]
'''

#: Row names of the NumPy workloads.
NUMPY_ROWS = {
    "small": "* NumPy small arrays, 20,000 x 4 arrays of 8 B-8 KiB (ms)",
    "medium": "* NumPy 2,000 arrays of 160 KB (ms)",
    "large": "* NumPy 32 MiB arrays, 6 x zeros/+=/empty_like/multiply (ms)",
    "resize": "* NumPy growing array, 3,000 x np.append (ms)",
}

#: Whole programs (``mixed`` always, ``pandas`` where installed): each returns a checksum.
PROGRAMS = r'''
def mixed():
    # Big temporaries: a 1,000,000 x 7 float64 table (56 MB) through ufunc expressions and a
    # cumulative sum, then rounds of concatenate, slicing, sort and mean.
    rng = np.random.default_rng(0)
    x = rng.random((1_000_000, 7))
    y = np.exp(x) * np.cos(x) + np.abs(x - 0.5)
    z = np.cumsum(y, axis=0)
    parts = [z[i::5] for i in range(5)]
    acc = 0.0
    for it in range(30):
        c = np.concatenate([parts[it % 5], parts[(it + 1) % 5]])
        s = np.sort(c[:, it % 7])
        acc += float(s[len(s) // 2]) + float(c.mean())
        acc += float((c * 1.5 + 2.0)[::2].sum())
    return acc

def pandas_program():
    # A table of 1,000,000 rows: a derived column, groupby, merge back, sort, pivot table.
    import pandas as pd
    rng = np.random.default_rng(1)
    n = 1_000_000
    df = pd.DataFrame({"k": rng.integers(0, 1000, n), "g": rng.integers(0, 20, n),
                       "a": rng.random(n), "b": rng.random(n)})
    df["c"] = df["a"] * df["b"] + np.log1p(df["a"])
    agg = df.groupby("k").agg(am=("a", "mean"), bs=("b", "sum"), cm=("c", "max"))
    m = df.merge(agg, left_on="k", right_index=True).sort_values(["g", "c"])
    p = m.pivot_table(index="g", columns=m["k"] % 10, values="a", aggfunc="mean")
    return float(p.to_numpy().sum()) + float(m["cm"].to_numpy()[::1000].sum())
'''

#: Row names of the whole programs, by worker.
PROGRAM_ROWS = {
    "mixed": "NumPy program of big temporaries",
    "pandas": "pandas program: groupby, merge, sort, pivot",
}

_COMMON = r"""
import json, statistics, sys, time
import numpy as np
def med(f, reps, sync=lambda: None):
    ts = []
    for _ in range(reps):
        sync(); t = time.perf_counter(); f(); sync(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
q = int(sys.argv[1])  # 1: quick
out = {}
"""

_PROGRAM_WORKER = (
    _COMMON
    + PROGRAMS
    + r"""
import resource
name, fn = sys.argv[3], {"mixed": mixed, "pandas": pandas_program}[sys.argv[3]]
t = time.perf_counter()
check = fn()
row = json.loads(sys.argv[2])[name]
out[row + " (ms)"] = (time.perf_counter() - t) * 1e3
out[row + ", peak memory of the process (MiB)"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out["check " + name] = check
import ump_alloc
out["on ump-alloc"] = bool(ump_alloc.handles(np.ones(4)))
print(json.dumps(out))
"""
)

_WORKERS = {
    "mixed": _PROGRAM_WORKER,
    "pandas": _PROGRAM_WORKER,
    # One timed pass of each workload after a warm-up pass, as benches/numpy_bench.py does.
    "numpy": _COMMON
    + NUMPY_WORKLOADS
    + r"""
ROWS = json.loads(sys.argv[2])
for name, fn in WORKLOADS:
    fn()
    t = time.perf_counter()
    check = fn()
    out[ROWS[name]] = (time.perf_counter() - t) * 1e3
    out["check " + name] = check
import ump_alloc
out["on ump-alloc"] = bool(ump_alloc.handles(np.ones(4)))
print(json.dumps(out))
""",
    "cupy": _COMMON
    + r"""
import cupy as cp
import ump_alloc
sync = cp.cuda.Device().synchronize
mib = 64 if q else 256
n = mib * 2**20 // 4
h = np.random.default_rng(0).random(n, dtype=np.float32)
g = cp.asarray(h); sync()
def up():
    cp.asarray(h)
def down():
    cp.asnumpy(g)
up(); down()
out[f"cupy.asarray, {mib} MiB (GB/s)"] = n * 4 / med(up, 5, sync) / 1e9
out[f"cupy.asnumpy, {mib} MiB (GB/s)"] = n * 4 / med(down, 5, sync) / 1e9
# A GPU result read by NumPy: a kernel writes fresh values, then ump_alloc.asnumpy (a view of
# ump-alloc memory, a copy of CuPy's own) and a read of every element.
write = cp.ElementwiseKernel("float32 v", "float32 y", "y = v + (float)(i & 1023)", "ump_bench_write")
res = cp.empty(n, cp.float32)
ts = []
for r in range(6):
    write(np.float32(r), res); sync()
    t = time.perf_counter()
    m = float(ump_alloc.asnumpy(res).max())
    ts.append(time.perf_counter() - t)
    assert m == r + 1023.0, m
out[f"GPU result read by NumPy: ump_alloc.asnumpy + max, {mib} MiB (ms)"] = statistics.median(ts[1:]) * 1e3
# benches/pipeline_bench.py's step (cupy).
raw = np.random.default_rng(0).random(n, dtype=np.float32)
def step():
    x = raw * 0.5 + 1.0
    y = cp.asarray(x)
    y = cp.sqrt(y); y *= 3.0; y += 1.0
    r = cp.asnumpy(y)
    return float(r[::1024].sum())
step(); step()
out[f"pipeline NumPy -> GPU -> NumPy, {mib} MiB (ms)"] = med(step, 7, sync) * 1e3
# benches/cupy_alloc_bench.py's loop.
count = 20_000 if q else 100_000
for size, label in ((4096, "4 KiB"), (1 << 20, "1 MiB")):
    def loop():
        for _ in range(count):
            m = cp.cuda.alloc(size); del m
    loop()
    out[f"CuPy alloc+free {label} (ns)"] = med(loop, 3) / count * 1e9
out["on ump-alloc"] = bool(ump_alloc.identify(cp.empty(1)).ours)
print(json.dumps(out))
""",
    "torch": _COMMON
    + r"""
import torch
if not torch.cuda.is_available():
    print(json.dumps({})); sys.exit(0)
sync = torch.cuda.synchronize
count = 20_000 if q else 100_000
torch.empty(1, device="cuda")
for numel, label in ((4096, "4 KiB"), (1 << 20, "1 MiB")):
    def loop():
        for _ in range(count):
            t = torch.empty(numel, dtype=torch.uint8, device="cuda"); del t
    loop()
    out[f"PyTorch empty+free {label} (ns)"] = med(loop, 3, sync) / count * 1e9
mib = 64 if q else 256
t = torch.rand(mib * 2**20 // 4, device="cuda"); sync()
def down():
    t.cpu()
down()
out[f"PyTorch .cpu(), {mib} MiB (GB/s)"] = mib * 2**20 / med(down, 5, sync) / 1e9
import ump_alloc
out["on ump-alloc"] = bool(ump_alloc.identify(torch.empty(1, device="cuda")).ours)
print(json.dumps(out))
""",
}

# Higher is better for these units.
_HIGHER_BETTER = ("GB/s",)


class BenchError(Exception):
    """A problem found before measuring (a missing package, a configuration error)."""


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu() -> bool:
    try:
        import ump_alloc

        caps = ump_alloc.capabilities()
        return bool(caps["cuda_available"] and caps["device_count"])
    except Exception:  # noqa: BLE001 - no library, no GPU
        return False


def _run(worker: str, ump: bool, quick: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "UMP_ALLOC"}  # the user's settings stay
    if ump:
        env["UMP_ALLOC"] = "1"
    rows = PROGRAM_ROWS if worker in PROGRAM_ROWS else NUMPY_ROWS
    start = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-c", _WORKERS[worker], "1" if quick else "0", json.dumps(rows), worker],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    whole = (time.perf_counter() - start) * 1e3
    if r.returncode != 0:
        raise RuntimeError(f"{worker} benchmark ({'UMP_ALLOC=1' if ump else 'default'}) failed:\n{r.stderr.strip()[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    if worker in PROGRAM_ROWS:
        out[PROGRAM_ROWS[worker] + ", whole process (ms)"] = whole
    on = out.pop("on ump-alloc", ump)
    if on != ump:
        # A comparison of the default with itself would look like "same within noise".
        raise RuntimeError(
            f"{worker} benchmark: the {'UMP_ALLOC=1' if ump else 'default'} run allocated "
            f"{'from its default allocator' if ump else 'from ump-alloc'}; "
            + ("is ump_alloc.pth in site-packages (pip install the package: PYTHONPATH alone does not run .pth files)?"
               if ump else "is UMP_ALLOC set by a sitecustomize or .pth file of its own?"))
    return out


def _progress(total: int) -> Callable[[str], None]:
    """A progress bar (tqdm when installed, else a line on stderr); returns step(label)."""
    try:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="ump-alloc bench", unit="run", file=sys.stderr)

        def step(label: str) -> None:
            bar.set_postfix_str(label)
            bar.update(1)
            if bar.n >= total:
                bar.close()

        return step
    except ImportError:
        done = [0]

        def step(label: str) -> None:
            done[0] += 1
            print(f"\r[{done[0]}/{total}] {label:<40}", end="\n" if done[0] >= total else "", file=sys.stderr, flush=True)

        return step


def check_ready() -> None:
    """Raise :class:`BenchError` if the ump-alloc runs could not start or would not be on
    ump-alloc: a configuration error stops every program run with ``UMP_ALLOC=1``, and without
    ``ump_alloc.pth`` the variable switches nothing on (each run also checks, in its own
    interpreter, which allocator it measured)."""
    import ump_alloc
    from ump_alloc import _enable

    for p in ump_alloc.config_errors():
        if p.startswith("configuration error:"):
            raise BenchError(f"{p} (python -m ump_alloc info shows the configuration)")
    if not _enable.pth_installed():
        raise BenchError("the ump-alloc runs switch on through UMP_ALLOC=1, which needs ump_alloc.pth in "
                         "site-packages: install the package with pip (pip install . in a checkout); "
                         "PYTHONPATH alone does not run .pth files")


def measure(quick: bool = False, rounds: int | None = None) -> dict:
    """Run every measurement this machine can do, ``rounds`` times each setting (default 7,
    5 with ``quick``), alternating. Returns ``{"rows": [...], "skipped": [...], ...}``; each
    row has ``name``, ``default`` and ``ump`` (medians, None where not measured),
    ``default_runs`` and ``ump_runs`` (every round's value) and ``better`` (the verdict)."""
    rounds = rounds or (5 if quick else 7)
    if rounds < 2:
        raise BenchError("--rounds must be at least 2: a verdict needs a spread")
    plan: list[str] = ["numpy", "mixed"]
    skipped: list[str] = []
    if _has("pandas"):
        plan.append("pandas")
    else:
        skipped.append("pandas program: pandas is not installed")
    gpu = _gpu()
    for worker in ("cupy", "torch"):
        if not gpu:
            skipped.append(f"{worker}: no CUDA GPU")
        elif not _has(worker):
            skipped.append(f"{worker}: not installed")
        else:
            plan.append(worker)
    step = _progress(2 * rounds * len(plan))
    runs: dict = {(w, u): [] for w in plan for u in (False, True)}
    for i in range(rounds):
        order = (False, True) if i % 2 == 0 else (True, False)
        for worker in plan:
            for ump in order:
                runs[(worker, ump)].append(_run(worker, ump, quick))
                step(f"round {i + 1}/{rounds}: {worker} ({'ump-alloc' if ump else 'default'})")
    rows = []
    for worker in plan:
        base, ours = runs[(worker, False)], runs[(worker, True)]
        names = list(dict.fromkeys([k for r in base + ours for k in r]))
        for name in names:
            if name.startswith("check "):
                checks = {r.get(name) for r in base + ours}
                if len(checks) != 1:
                    raise RuntimeError(f"{name[6:]}: the two allocators computed different results {checks}")
                continue
            d = [r[name] for r in base if name in r]
            u = [r[name] for r in ours if name in r]
            rows.append({
                "name": name,
                "default": statistics.median(d) if d else None,
                "ump": statistics.median(u) if u else None,
                "default_runs": d,
                "ump_runs": u,
                "better": verdict(name, d, u),
            })
    return {"rows": rows, "skipped": skipped, "gpu": gpu, "quick": quick, "rounds": rounds,
            "python": sys.version.split()[0], "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def _speed(name: str, default: float, ump: float) -> float:
    """How many times faster ump-alloc is than the default for this row (< 1: slower)."""
    if any(x in name for x in _HIGHER_BETTER):
        return ump / default
    return default / ump if ump else math.inf


#: Fewest runs of each setting for a verdict: with 4, two equal allocators give one by chance
#: once in 35 times; with 3, once in 10.
MIN_VERDICT_ROUNDS = 4


def verdict(name: str, default_runs: list, ump_runs: list) -> str:
    """"ump-alloc 1.35x faster" / "default 1.35x faster" (by the medians; "less memory" for a
    row in MiB) only when every run
    of one beat every run of the other, each side having at least ``MIN_VERDICT_ROUNDS`` runs;
    "same within noise" when the runs overlap; "too few rounds" below that; "-" when a side was
    not measured."""
    if not default_runs or not ump_runs:
        return "-"
    if min(len(default_runs), len(ump_runs)) < MIN_VERDICT_ROUNDS:
        return "too few rounds for a verdict"
    higher = any(x in name for x in _HIGHER_BETTER)
    d_lo, d_hi, u_lo, u_hi = min(default_runs), max(default_runs), min(ump_runs), max(ump_runs)
    ump_wins = u_lo > d_hi if higher else u_hi < d_lo
    default_wins = d_lo > u_hi if higher else d_hi < u_lo
    s = _speed(name, statistics.median(default_runs), statistics.median(ump_runs))
    word = "less memory" if name.endswith("(MiB)") else "faster"
    if ump_wins:
        return f"ump-alloc {s:.2f}x {word}"
    if default_wins:
        return f"default {1 / s:.2f}x {word}"
    return "same within noise"


def _chance(rounds: int) -> int:
    """1 in how many: the chance that, with two equal allocators, every run of one beats every
    run of the other (either way round) in ``rounds`` runs each."""
    return math.comb(2 * rounds, rounds) // 2


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:#.3g}" if abs(v) < 10 else f"{v:,.1f}"


def _cell(median: float | None, runs: list) -> str:
    if median is None:
        return "-"
    return f"{_fmt(median)} ({_fmt(min(runs))}-{_fmt(max(runs))})"


def table(result: dict) -> str:
    """The result as a text table."""
    rows = result["rows"]
    w = max([len(r["name"]) for r in rows] + [20])
    n = result.get("rounds", 0)
    cells = [(_cell(r["default"], r.get("default_runs") or []), _cell(r["ump"], r.get("ump_runs") or [])) for r in rows]
    c = max([len(x) for pair in cells for x in pair] + [12])
    lines = [
        f"{n} rounds, each setting in a fresh interpreter, alternating: median (lowest-highest)",
        f"{'measurement':<{w}}  {'default':<{c}}  {'ump-alloc':<{c}}  verdict",
        "-" * (w + 2 * c + 26),
    ]
    for r, (d, u) in zip(rows, cells):
        lines.append(f"{r['name']:<{w}}  {d:<{c}}  {u:<{c}}  {r['better']}")
    if n >= MIN_VERDICT_ROUNDS:
        lines.append(f"A verdict only where every run of one setting beat every run of the other (for two "
                     f"equal allocators, 1 chance in {_chance(n)} with {n} rounds); otherwise the "
                     "difference is within this machine's noise.")
    elif n:
        lines.append(f"No verdicts with {n} rounds: {MIN_VERDICT_ROUNDS} or more are needed.")
    if any(r["name"].startswith("*") for r in rows):
        lines.append("* A loop that does little but allocate: the allocator's own cost, not what a program "
                     "gains. The program rows (time, whole process, peak memory) are what a program sees.")
    for s in result["skipped"]:
        lines.append(f"(not measured: {s})")
    if not result["gpu"]:
        lines.append("No CUDA GPU: only the host part ran.")
    return "\n".join(lines)


def _pyplot():
    """matplotlib's pyplot (Agg backend), or :class:`BenchError` with the install hint: where it
    is missing, and where it is there but broken (a folder left without ``__init__.py`` imports
    as an empty namespace, whose ``use`` is an AttributeError; a build for another NumPy)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - any failure here is "cannot use matplotlib"
        raise BenchError(f"--plot needs matplotlib, which cannot be imported here ({type(e).__name__}: {e}): "
                         "pip install matplotlib") from None
    return plt


def check_plot(path: str) -> None:
    """Raise :class:`BenchError` now, before any measurement, if ``--plot path`` could not be
    written: matplotlib missing, or a folder that does not exist or is not writable."""
    _pyplot()
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise BenchError(f"--plot {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise BenchError(f"--plot {path}: the folder {folder} is not writable")


def plot(result: dict, path: str) -> None:
    """A bar chart of ump-alloc's speed relative to the default (1.0 = equal) to ``path``: the
    ratio of the medians, with the range the runs allow as error bars."""
    plt = _pyplot()
    rows = [r for r in result["rows"] if r["default"] and r["ump"]]
    names, speed, lo, hi, colors = [], [], [], [], []
    for r in rows:
        d, u = r.get("default_runs") or [r["default"]], r.get("ump_runs") or [r["ump"]]
        s = _speed(r["name"], r["default"], r["ump"])
        extremes = [_speed(r["name"], x, y) for x in (min(d), max(d)) for y in (min(u), max(u))]
        names.append(r["name"])
        speed.append(s)
        lo.append(max(0.0, s - min(extremes)))
        hi.append(max(0.0, max(extremes) - s))
        colors.append("tab:green" if r["better"].startswith("ump") else "tab:red" if r["better"].startswith("default") else "tab:gray")
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(rows) + 1.8))
    ax.barh(names, speed, xerr=[lo, hi], color=colors, capsize=3)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speed with ump-alloc / default (higher is better; gray: within noise)")
    ax.set_title(f"ump-alloc bench, {result.get('rounds', '?')} rounds ({result['time']})")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ump_alloc bench", description=" ".join(__doc__.split("\n\n")[:2]).replace("``", ""))
    p.add_argument("--quick", action="store_true", help="smaller GPU sizes, shorter loops and 5 rounds instead of 7")
    p.add_argument("--rounds", type=int, default=None,
                   help=f"rounds of each setting (default 7, 5 with --quick; verdicts need {MIN_VERDICT_ROUNDS})")
    p.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")
    p.add_argument("--plot", metavar="FILE.png", help="draw a chart (needs matplotlib)")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:
        if args.plot:
            check_plot(args.plot)
        check_ready()
        result = measure(quick=args.quick, rounds=args.rounds)
    except BenchError as e:
        print(f"ump_alloc bench: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    if args.plot:
        plot(result, args.plot)
        print(f"chart: {args.plot}", file=sys.stderr)
    return 0
