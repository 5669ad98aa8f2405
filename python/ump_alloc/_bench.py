"""``python -m ump_alloc bench``: the measurements that matter, on the user's machine.

Each measurement runs in a fresh interpreter twice, once with the default allocators and once
with ``UMP_ALLOC=1`` (the program text is the same; only the environment differs), so that
NumPy's, CuPy's and PyTorch's own allocators are what ump-alloc is compared with:

- NumPy: small arrays (alloc+free of 64 B .. 4 KiB arrays) and large ones (64 MiB, written);
- GPU (CuPy): host->device and device->host copies of 256 MiB, the zero-copy view
  (``ump_alloc.asnumpy``) against ``cupy.asnumpy``, the NumPy -> GPU -> NumPy pipeline;
- allocation latency: CuPy (alloc+free 4 KiB and 1 MiB) and PyTorch (``torch.empty`` + drop).

Without a GPU (or without CuPy / PyTorch) only what can run is measured, and the table says why
the rest is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Callable, Iterable

_COMMON = r"""
import json, sys, time
import numpy as np
def med(f, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort()
    return ts[len(ts) // 2]
q = int(sys.argv[1])  # 1: quick
out = {}
"""

_WORKERS = {
    "numpy": _COMMON
    + r"""
n = 20_000 if q else 200_000
sizes = [8, 64, 512]  # elements of float64: 64 B, 512 B, 4 KiB
def small():
    for i in range(n):
        a = np.empty(sizes[i % 3]); del a
small()
out["numpy small arrays (alloc+free, ns)"] = med(small, 3 if q else 5) / n * 1e9
big = 8 << 20
def large():
    for _ in range(4 if q else 16):
        a = np.empty(big); a[::512] = 1.0; del a
large()
out["numpy 64 MiB arrays (alloc+write+free, ms)"] = med(large, 3) / (4 if q else 16) * 1e3
print(json.dumps(out))
""",
    "cupy": _COMMON
    + r"""
import cupy as cp
sync = cp.cuda.Device().synchronize
nb = (64 if q else 256) << 20
h = np.random.default_rng(0).random(nb // 4, dtype=np.float32)
g = cp.asarray(h); sync()
def up():
    cp.asarray(h); sync()
def down():
    cp.asnumpy(g)
up(); down()
out["host->device copy (GB/s)"] = nb / med(up, 5) / 1e9
out["device->host copy (GB/s)"] = nb / med(down, 5) / 1e9
try:
    import ump_alloc
    if ump_alloc.is_enabled():
        def view():
            ump_alloc.asnumpy(g, copy=False)
        view()
        out["device->host zero-copy view (GB/s)"] = nb / med(view, 5) / 1e9
except ImportError:
    pass
def pipe():
    x = h * 0.5 + 1.0
    y = cp.asarray(x); y = cp.sqrt(y); y *= 3.0
    r = cp.asnumpy(y); float(r[::1024].sum())
pipe()
out["pipeline NumPy->GPU->NumPy (ms)"] = med(pipe, 5) * 1e3
n = 20_000 if q else 100_000
for size, label in ((4096, "4 KiB"), (1 << 20, "1 MiB")):
    def loop():
        for _ in range(n):
            m = cp.cuda.alloc(size); del m
    loop()
    out[f"CuPy alloc+free {label} (ns)"] = med(loop, 3) / n * 1e9
print(json.dumps(out))
""",
    "torch": _COMMON
    + r"""
import torch
if not torch.cuda.is_available():
    print(json.dumps({})); sys.exit(0)
n = 20_000 if q else 100_000
torch.empty(1, device="cuda")
for numel, label in ((4096, "4 KiB"), (1 << 20, "1 MiB")):
    def loop():
        for _ in range(n):
            t = torch.empty(numel, dtype=torch.uint8, device="cuda"); del t
    loop()
    out[f"PyTorch empty+free {label} (ns)"] = med(loop, 3) / n * 1e9
nb = (64 if q else 256) << 20
t = torch.rand(nb // 4, device="cuda"); torch.cuda.synchronize()
def down():
    t.cpu()
down()
out["PyTorch .cpu() (GB/s)"] = nb / med(down, 5) / 1e9
print(json.dumps(out))
""",
}

# Higher is better for these units.
_HIGHER_BETTER = ("GB/s",)


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpu() -> bool:
    try:
        import ump_alloc

        return bool(ump_alloc.capabilities()["cuda_available"] and ump_alloc.capabilities()["device_count"])
    except Exception:  # noqa: BLE001 - no library, no GPU
        return False


def _run(worker: str, ump: bool, quick: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC")}
    for k, v in os.environ.items():  # keep the user's settings, not the switch itself
        if k.startswith("UMP_ALLOC_"):
            env[k] = v
    if ump:
        env["UMP_ALLOC"] = "1"
    r = subprocess.run(
        [sys.executable, "-c", _WORKERS[worker], "1" if quick else "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{worker} benchmark failed:\n{r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _progress(total: int) -> Callable[[str], None]:
    """A progress bar (tqdm or rich when installed, else a line on stderr); returns step(label)."""
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


def measure(quick: bool = False) -> dict:
    """Run every measurement this machine can do. Returns ``{"rows": [...], "skipped": [...]}``;
    each row: name, default, ump (None where not measured), better ("ump", "default" or "same")."""
    plan: list[str] = ["numpy"]
    skipped: list[str] = []
    gpu = _gpu()
    for worker in ("cupy", "torch"):
        if not gpu:
            skipped.append(f"{worker}: no CUDA GPU")
        elif not _has(worker):
            skipped.append(f"{worker}: not installed")
        else:
            plan.append(worker)
    step = _progress(2 * len(plan))
    results: dict = {}
    for worker in plan:
        for ump in (False, True):
            label = f"{worker} ({'ump-alloc' if ump else 'default'})"
            results[(worker, ump)] = _run(worker, ump, quick)
            step(label)
    rows = []
    for worker in plan:
        base, ours = results[(worker, False)], results[(worker, True)]
        for name in list(dict.fromkeys(list(base) + list(ours))):
            d, u = base.get(name), ours.get(name)
            rows.append({"name": name, "default": d, "ump": u, "better": _better(name, d, u)})
    return {"rows": rows, "skipped": skipped, "gpu": gpu, "quick": quick,
            "python": sys.version.split()[0], "time": time.strftime("%Y-%m-%d %H:%M:%S")}


def _better(name: str, d, u) -> str:
    if d is None or u is None:
        return "-"
    higher = any(x in name for x in _HIGHER_BETTER)
    ratio = (u / d) if higher else (d / u if u else float("inf"))
    if 0.97 <= ratio <= 1.03:
        return "same"
    return f"ump {ratio:.2f}x" if ratio > 1 else f"default {1 / ratio:.2f}x"


def table(result: dict) -> str:
    """The result as a text table."""
    rows = result["rows"]
    w = max([len(r["name"]) for r in rows] + [20])
    fmt = lambda v: "-" if v is None else f"{v:,.2f}"  # noqa: E731
    lines = [f"{'measurement':<{w}}  {'default':>12}  {'ump-alloc':>12}  better", "-" * (w + 42)]
    for r in rows:
        lines.append(f"{r['name']:<{w}}  {fmt(r['default']):>12}  {fmt(r['ump']):>12}  {r['better']}")
    for s in result["skipped"]:
        lines.append(f"(not measured: {s})")
    if not result["gpu"]:
        lines.append("No CUDA GPU: only the host part ran.")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """A bar chart of ump-alloc's speed relative to the default (1.0 = equal) to ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit("--plot needs matplotlib: pip install 'ump-alloc[bench]' (or matplotlib)") from e
    rows = [r for r in result["rows"] if r["default"] and r["ump"]]
    names = [r["name"] for r in rows]
    speed = []
    for r in rows:
        higher = any(x in r["name"] for x in _HIGHER_BETTER)
        speed.append(r["ump"] / r["default"] if higher else r["default"] / r["ump"])
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    ax.barh(names, speed, color=["tab:green" if s >= 1 else "tab:red" for s in speed])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("speed with ump-alloc / default (higher is better)")
    ax.set_title(f"ump-alloc bench ({result['time']})")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ump_alloc bench", description=__doc__.split("\n\n")[0].replace("``", ""))
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer repetitions")
    p.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")
    p.add_argument("--plot", metavar="FILE.png", help="draw a chart (needs matplotlib)")
    args = p.parse_args(list(argv) if argv is not None else None)
    result = measure(quick=args.quick)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(table(result))
    if args.plot:
        plot(result, args.plot)
        print(f"chart: {args.plot}", file=sys.stderr)
    return 0
