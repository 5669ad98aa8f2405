"""PyTorch transfers in an unchanged program, with and without ump-alloc (issue 11).

Each configuration runs in a fresh interpreter; the program text is the same, only the
environment differs:

- ``default``: no ump-alloc;
- ``ump``: ``UMP_ALLOC=1`` (``.cpu()`` into ump-alloc's pinned host side);
- ``ump-nofast``: ``UMP_ALLOC=1 UMP_ALLOC_TORCH_FAST_CPU=0`` (PyTorch's own CPU memory).

Measured: ``.cpu()`` / ``.to("cpu")`` / ``.numpy(force=True)`` of 1 GiB (GB/s),
``torch.from_numpy(a).cuda()`` of 1 GiB, and a small training loop (an MLP with a ``.item()``
and a ``.cpu()`` of the logits per step) in steps per second, to show the patch's overhead.

    python benches/torch_transfer_bench.py [--gib 1] [--steps 300]

Exits 0 with a message without a GPU or PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r'''
import json, sys, time, statistics
import numpy as np, torch
gib, steps = float(sys.argv[1]), int(sys.argv[2])
n = int(gib * 2**30) // 4
out = {}
def med(f, reps=5):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize(); t = time.perf_counter(); f(); torch.cuda.synchronize(); ts.append(time.perf_counter() - t)
    return statistics.median(ts)
g = torch.rand(n, device="cuda")
for name, f in (("cpu()", lambda: g.cpu()), ('to("cpu")', lambda: g.to("cpu")), ("numpy(force=True)", lambda: g.numpy(force=True))):
    f()
    out[f"{name} GB/s"] = n * 4 / med(f) / 1e9
a = np.random.default_rng(0).random(n, dtype=np.float32)
torch.from_numpy(a).cuda()
out["from_numpy(a).cuda() GB/s"] = n * 4 / med(lambda: torch.from_numpy(a).cuda()) / 1e9
try:
    import ump_alloc
    out["host kind"] = ump_alloc.identify(g.cpu()).kind if ump_alloc.is_enabled() else "torch"
except ImportError:
    out["host kind"] = "torch"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(256, 512, device="cuda"); y = torch.randint(0, 10, (256,), device="cuda")
def train(k):
    for _ in range(k):
        opt.zero_grad(set_to_none=True)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        loss.backward(); opt.step()
        loss.item(); logits.detach().cpu()
train(20)
rates = []
for _ in range(5):
    torch.cuda.synchronize(); t = time.perf_counter(); train(steps); torch.cuda.synchronize()
    rates.append(steps / (time.perf_counter() - t))
out["train steps/s"] = statistics.median(rates)
print(json.dumps(out))
'''

CONFIGS = {"default": {}, "ump": {"UMP_ALLOC": "1"}, "ump-nofast": {"UMP_ALLOC": "1", "UMP_ALLOC_TORCH_FAST_CPU": "0"}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--rounds", type=int, default=2, help="configurations are run this many times, interleaved")
    args = p.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:  # noqa: BLE001
        print(f"skipped: no PyTorch GPU ({e})")
        return 0
    from _benchutil import ump_env

    results: dict = {c: [] for c in CONFIGS}
    for r in range(args.rounds):
        for c, extra in CONFIGS.items():
            env = ump_env(extra)
            res = subprocess.run([sys.executable, "-c", WORKER, str(args.gib), str(args.steps)], capture_output=True, text=True, env=env)
            if res.returncode != 0:
                print(f"{c}: failed\n{res.stderr[-2000:]}")
                return 1
            results[c].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {c}: {results[c][-1]}", file=sys.stderr, flush=True)
    keys = [k for k in results["default"][0] if k != "host kind"]
    print(f"{'':<28}" + "".join(f"{c:>14}" for c in CONFIGS))
    for k in keys:
        vals = [max(x[k] for x in results[c]) for c in CONFIGS]  # best round: host timings are noisy
        print(f"{k:<28}" + "".join(f"{v:>14.2f}" for v in vals))
    print(f"{'CPU result memory':<28}" + "".join(f"{results[c][0]['host kind']:>14}" for c in CONFIGS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
