"""Fragmentation: a training-style workload whose sizes change every step, with long-lived
blocks allocated between the step's activations, on every allocator side by side. Each
configuration runs in a fresh process (an allocator is fixed per process), in turn, repeated.

    python3 benches/fragmentation_bench.py                      # every configuration, table + JSON
    python3 benches/fragmentation_bench.py --only torch-native,ump-torch --repeat 3
    python3 benches/fragmentation_bench.py --run ump-torch      # one run in this process

The workload (the same seeded sequence for every configuration): 6 layers of an MLP block and
an attention-score block (fp16 matrix products on random data) over B x L tokens, forward then
backward, one host synchronisation per step. L is drawn every step from 512-2048 in the big
phase (5 warm-up steps, then --steps timed ones) and from 64-384 in the small phase that
follows (run for 2.5 s). Every 4th step keeps a
block of 4-96 MiB, allocated in the middle of the forward pass, alive for 20 steps.

Reported per configuration (median over the repeats):
- peak reserved: memory held from the driver at its peak (torch: max_memory_reserved; CuPy's
  pools: total_bytes, with cudaMemPoolAttrReservedMemHigh for the async pool; ump-alloc, on
  either route: the device's mapped_peak, i.e. committed physical memory);
- peak in use: the allocator's own figure (torch, and ump-alloc's segments route where PyTorch's
  caching allocator sits on top: max_memory_allocated; CuPy: used_bytes at each step's peak;
  ump-alloc's swap route: in_use_peak) and the workload's own count of live bytes;
- time: seconds for the big phase's timed steps (synchronised), median and fastest run;
- after: memory held at the end of the small phase, with no trim or empty_cache.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

B, H, F, LAYERS = 8, 1024, 4096, 6
BIG, SMALL = (512, 2048), (64, 384)
KEEP_EVERY, KEEP_FOR, KEEP_MIB = 4, 20, (4, 96)
WARMUP = 5
MIB = 1 << 20

CONFIGS: dict[str, dict[str, str]] = {
    "torch-native": {},
    "torch-expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "torch-async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    # PyTorch's caching allocator on top, ump-alloc's segments below (the default route): the
    # default device side (managed memory), and plain device memory (the virtual-memory pool).
    "ump-torch-segments": {},
    "ump-torch-segments-device": {"UMP_ALLOC_DEVICE_SIDE": "device"},
    # ump-alloc instead of PyTorch's allocator (the swap route), on plain device memory.
    "ump-torch": {"UMP_ALLOC_DEVICE_SIDE": "device", "UMP_ALLOC_TORCH_ROUTE": "swap"},
    "ump-torch-chunks": {"UMP_ALLOC_DEVICE_SIDE": "device", "UMP_ALLOC_DEVICE_VMM": "0", "UMP_ALLOC_TORCH_ROUTE": "swap"},
    "cupy-pool": {},
    "cupy-async": {},
    "ump-cupy": {"UMP_ALLOC_DEVICE_SIDE": "device"},
}


class Torch:
    """The workload's operations in PyTorch."""

    def __init__(self, use_ump: bool):
        self.route = None
        if use_ump:
            import ump_alloc

            ump_alloc.enable(cupy=False, torch=True)
        import torch

        if use_ump:
            from _benchutil import torch_route

            self.route = torch_route()
        self.t = torch
        self.use_ump = use_ump
        self.gen = torch.Generator(device="cuda").manual_seed(7)

    def randn(self, *shape):
        return self.t.randn(*shape, device="cuda", dtype=self.t.float16, generator=self.gen) * 0.02

    def empty(self, nbytes):
        return self.t.empty(nbytes, dtype=self.t.uint8, device="cuda")

    def mm(self, a, b):
        return a @ b

    def relu(self, x):
        return self.t.relu(x)

    def masked(self, g, h):
        return g * (h > 0)

    def scores(self, x, L):
        x3 = x.view(B, L, H)
        return self.t.bmm(x3, x3.transpose(1, 2))

    def scale(self, s):
        return s * 0.5

    def nbytes(self, x):
        return x.numel() * x.element_size()

    def sync(self, x):
        return float(x[0, 0])

    def sample(self):
        """A point where the step may peak (the allocators that keep no peak are read here)."""

    def extra(self) -> dict:
        """ump-alloc's own counters, for the JSON."""
        if not self.use_ump:
            return {}
        import ump_alloc

        d = ump_alloc.stats()["devices"][0]
        return {k: d[k] for k in ("hits", "misses", "reserved", "largest_free", "fragmentation")}

    def held(self) -> tuple[int, int, int, int]:
        """(reserved now, peak reserved, peak in use, in use now) from the allocator."""
        t = self.t
        if self.use_ump:
            import ump_alloc

            d = ump_alloc.stats()["devices"][0]
            if self.route == "segments":
                return d["mapped"], d["mapped_peak"], t.cuda.max_memory_allocated(), t.cuda.memory_allocated()
            return d["mapped"], d["mapped_peak"], d["in_use_peak"], d["in_use"]
        return (
            t.cuda.memory_reserved(),
            t.cuda.max_memory_reserved(),
            t.cuda.max_memory_allocated(),
            t.cuda.memory_allocated(),
        )


class CuPy(Torch):
    """The same operations in CuPy."""

    def __init__(self, kind: str):
        import cupy as cp

        self.cp = cp
        self.kind = kind
        if kind == "ump":
            import ump_alloc

            ump_alloc.enable(cupy=True, torch=False)
        elif kind == "async":
            self.pool = cp.cuda.MemoryAsyncPool()
            cp.cuda.set_allocator(self.pool.malloc)
        else:
            self.pool = cp.get_default_memory_pool()
        self.rs = cp.random.RandomState(7)
        self.peak_used = 0

    def randn(self, *shape):
        return (self.rs.standard_normal(shape, dtype=self.cp.float32) * 0.02).astype(self.cp.float16)

    def empty(self, nbytes):
        return self.cp.empty(nbytes, dtype=self.cp.uint8)

    def relu(self, x):
        return self.cp.maximum(x, 0)

    def scores(self, x, L):
        x3 = x.reshape(B, L, H)
        return self.cp.matmul(x3, x3.transpose(0, 2, 1))

    def nbytes(self, x):
        return x.nbytes

    def sync(self, x):
        self.sample()
        return float(x[0, 0])

    def sample(self):
        if self.kind != "ump":
            self.peak_used = max(self.peak_used, self.pool.used_bytes())

    def extra(self):
        self.use_ump = self.kind == "ump"
        return Torch.extra(self)

    def held(self):
        if self.kind == "ump":
            import ump_alloc

            d = ump_alloc.stats()["devices"][0]
            return d["mapped"], d["mapped_peak"], d["in_use_peak"], d["in_use"]
        total = self.pool.total_bytes()
        peak = total
        if self.kind == "async":
            rt = self.cp.cuda.runtime
            peak = rt.memPoolGetAttribute(rt.deviceGetMemPool(0), 6)  # cudaMemPoolAttrReservedMemHigh
        return total, peak, self.peak_used, self.pool.used_bytes()


def workload(xp, n_big: int) -> dict:
    rng = np.random.default_rng(1234)
    params = [(xp.randn(H, F), xp.randn(F, H)) for _ in range(LAYERS)]
    kept: list[tuple[int, object]] = []  # (step it goes at, block)
    live = {"now": 0, "peak": 0}

    def track(*xs):
        live["now"] += sum(xp.nbytes(x) for x in xs)
        live["peak"] = max(live["peak"], live["now"])

    def untrack(*xs):
        live["now"] -= sum(xp.nbytes(x) for x in xs)

    track(*[w for p in params for w in p])

    def step(i: int, lo_hi: tuple[int, int]) -> None:
        L = int(rng.integers(lo_hi[0] // 8, lo_hi[1] // 8 + 1)) * 8
        x = xp.randn(B * L, H)
        track(x)
        acts = []
        for layer, (w1, w2) in enumerate(params):
            h = xp.mm(x, w1)
            a = xp.relu(h)
            s = xp.scores(x, L)
            y = xp.mm(a, w2)
            track(h, a, s, y)
            acts.append((x, h, a, s))
            if layer == 2 and i % KEEP_EVERY == 0:
                k = xp.empty(int(rng.integers(KEEP_MIB[0], KEEP_MIB[1] + 1)) * MIB)
                track(k)
                kept.append((i + KEEP_FOR, k))
            x = y
        xp.sample()
        g = x
        for w1, w2 in reversed(params):
            x_, h, a, s = acts.pop()
            ga = xp.mm(g, w2.T)
            gh = xp.masked(ga, h)
            gs = xp.scale(s)
            g2 = xp.mm(gh, w1.T)
            track(ga, gh, gs, g2)
            untrack(ga, gh, gs, h, a, s, x_, g)
            del ga, gh, gs, h, a, s, x_
            g = g2
        while kept and kept[0][0] <= i:
            untrack(kept.pop(0)[1])
        xp.sync(g)
        untrack(g)

    for i in range(WARMUP):
        step(i, BIG)
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + n_big):
        step(i, BIG)
    big_s = time.perf_counter() - t0
    i = WARMUP + n_big
    t1 = time.perf_counter()
    while time.perf_counter() - t1 < 2.5:
        step(i, SMALL)
        i += 1
    reserved_now, peak_reserved, peak_in_use, in_use_now = xp.held()
    return {
        "steps_big": n_big,
        "time_big_s": big_s,
        "peak_reserved": peak_reserved,
        "peak_in_use": peak_in_use,
        "workload_peak": live["peak"],
        "reserved_after": reserved_now,
        "in_use_after": in_use_now,
        "steps_small": i - WARMUP - n_big,
        **xp.extra(),
    }


def run_one(name: str, steps: int) -> dict:
    if name.startswith("cupy") or name == "ump-cupy":
        xp = CuPy({"cupy-pool": "pool", "cupy-async": "async", "ump-cupy": "ump"}[name])
    else:
        xp = Torch(use_ump=name.startswith("ump"))
    r = workload(xp, steps)
    r["config"] = name
    r["route"] = getattr(xp, "route", None)
    return r


def run_in_child(name: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UMP_ALLOC_", "PYTORCH_CUDA_ALLOC_CONF"))}
    if "UMP_ALLOC_LIBRARY" in os.environ:
        env["UMP_ALLOC_LIBRARY"] = os.environ["UMP_ALLOC_LIBRARY"]
    env.pop("UMP_ALLOC", None)
    env.update(CONFIGS[name])
    if name.startswith("ump-torch"):
        env["UMP_ALLOC_TORCH_ROUTE"] = CONFIGS[name].get("UMP_ALLOC_TORCH_ROUTE", "segments")
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--run", name, "--steps", str(steps)], env=env, capture_output=True, text=True, timeout=600
    )
    if r.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{r.stdout}\n{r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated configurations (default: all)")
    ap.add_argument("--repeat", type=int, default=2, help="runs per configuration, in turn (default 2)")
    ap.add_argument("--steps", type=int, default=60, help="timed steps of the big phase (default 60)")
    ap.add_argument("--run", metavar="CONFIG", help="run one configuration in this process, print JSON")
    ap.add_argument("--json", metavar="FILE", help="also write every run to FILE")
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run, args.steps)))
        return
    from _benchutil import gpu_or_skip

    names = args.only.split(",") if args.only else list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    needs = {"torch"} if any(not n.endswith("cupy") and "cupy-" not in n for n in names) else set()
    needs |= {"cupy"} if any("cupy" in n for n in names) else set()
    gpu_or_skip(*sorted(needs))
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for rep in range(args.repeat):
        for n in names:
            print(f"[{rep + 1}/{args.repeat}] {n} ...", file=sys.stderr, flush=True)
            runs[n].append(run_in_child(n, args.steps))
    med = {
        n: {k: float(np.median([r[k] for r in rs])) for k in rs[0] if isinstance(rs[0][k], (int, float))}
        for n, rs in runs.items()
    }
    fastest = {n: min(r["time_big_s"] for r in rs) for n, rs in runs.items()}
    base = med.get("torch-native", {}).get("time_big_s")
    base_min = fastest.get("torch-native")
    print(
        f"{'configuration':18} {'peak reserved':>14} {'peak in use':>12} {'ratio':>6} {'workload':>9} "
        f"{'time median':>11} {'vs native':>9} {'time min':>9} {'vs native':>9} {'after (MiB)':>12}"
    )
    for n, m in med.items():
        ratio = m["peak_reserved"] / m["peak_in_use"] if m["peak_in_use"] else float("nan")
        rel = f"{m['time_big_s'] / base:.3f}x" if base else "-"
        rel_min = f"{fastest[n] / base_min:.3f}x" if base_min else "-"
        print(
            f"{n:18} {m['peak_reserved'] / MIB:11.0f} MiB {m['peak_in_use'] / MIB:8.0f} MiB {ratio:6.3f} "
            f"{m['workload_peak'] / MIB:6.0f} MiB {m['time_big_s']:10.3f}s {rel:>9} {fastest[n]:8.3f}s {rel_min:>9} "
            f"{m['reserved_after'] / MIB:12.0f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
