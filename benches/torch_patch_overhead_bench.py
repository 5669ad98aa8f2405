"""The overhead of ump-alloc's PyTorch transfer patch on a training loop, in one process.

A model trains with a ``loss.item()`` and a ``logits.detach().cpu()`` per step (the calls the
patch intercepts): ``--model mlp`` (512-1024-10, batch 256) or ``--model resnet18``
(torchvision, 10 classes, batch 64 of 3x128x128). Rounds alternate between the patched
``Tensor.cpu``/``to``/``numpy`` and PyTorch's own methods in the same process (so that machine
and process noise hit both alike); the medians are compared. It also counts the intercepted
calls per step and times a small ``.cpu()`` both ways.

    UMP_ALLOC_LIBRARY=... python benches/torch_patch_overhead_bench.py [--model mlp|resnet18|both]
        [--rounds 6] [--steps 300]

Exits 0 with a message without a GPU, PyTorch or (for resnet18) torchvision.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def build(torch, name):
    """The model, its optimiser and one batch, on the GPU."""
    if name == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
        x = torch.randn(256, 512, device="cuda")
        y = torch.randint(0, 10, (256,), device="cuda")
    else:
        import torchvision

        model = torchvision.models.resnet18(num_classes=10)
        x = torch.randn(64, 3, 128, 128, device="cuda")
        y = torch.randint(0, 10, (64,), device="cuda")
    model = model.cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), x, y


def bench(torch, orig, name, rounds, steps):
    torch.manual_seed(0)
    model, opt, x, y = build(torch, name)
    patched = {k: getattr(torch.Tensor, k) for k in ("cpu", "to", "numpy")}
    counts = dict.fromkeys(patched, 0)

    def counting(k):
        f = patched[k]

        def wrap(*a, **kw):
            counts[k] += 1
            return f(*a, **kw)

        return wrap

    def use(mode):
        src = {"patched": patched, "orig": orig, "count": {k: counting(k) for k in patched}}[mode]
        for k in patched:
            setattr(torch.Tensor, k, src[k])

    def train(k):
        for _ in range(k):
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            loss.backward()
            opt.step()
            loss.item()
            logits.detach().cpu()

    use("count")
    train(10)
    print(f"[{name}] intercepted calls per 10 steps: {counts}", flush=True)
    use("patched")
    train(max(10, steps // 6))  # warm-up (cuDNN autotuning, caches)
    rates: dict[str, list[float]] = {"patched": [], "orig": []}
    for r in range(rounds):
        for mode in ("patched", "orig") if r % 2 == 0 else ("orig", "patched"):
            use(mode)
            torch.cuda.synchronize()
            t = time.perf_counter()
            train(steps)
            torch.cuda.synchronize()
            rates[mode].append(steps / (time.perf_counter() - t))
        print(f"[{name}] round {r + 1}/{rounds}: patched {rates['patched'][-1]:.1f}, "
              f"original {rates['orig'][-1]:.1f} steps/s", flush=True)
    use("patched")
    med = {k: statistics.median(v) for k, v in rates.items()}
    over = (med["orig"] / med["patched"] - 1) * 100
    print(f"[{name}] median steps/s: patched {med['patched']:.1f}, original {med['orig']:.1f} "
          f"(overhead {over:+.2f} %; rounds {rates})", flush=True)
    return med, over


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "resnet18", "both"], default="mlp")
    p.add_argument("--rounds", type=int, default=6, help="rounds of each configuration (interleaved)")
    p.add_argument("--steps", type=int, default=300, help="training steps per round")
    args = p.parse_args()
    try:
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device")
    except Exception as e:  # noqa: BLE001
        print(f"skipped: no PyTorch GPU ({e})")
        return 0
    import ump_alloc

    # PyTorch's own methods, taken before ump-alloc patches them (enable() patches at once when
    # PyTorch is already imported): the public API only, no look into the package's modules.
    orig = {k: getattr(torch.Tensor, k) for k in ("cpu", "to", "numpy")}
    ump_alloc.enable(cupy=False, torch=True)
    if all(getattr(torch.Tensor, k) is f for k, f in orig.items()):
        print("skipped: the transfer patch is off (UMP_ALLOC_TORCH_FAST_CPU=0)")
        return 0
    for name in ("mlp", "resnet18") if args.model == "both" else (args.model,):
        if name == "resnet18":
            try:
                import torchvision  # noqa: F401
            except ImportError:
                print("resnet18 skipped: torchvision is not installed")
                continue
        bench(torch, orig, name, args.rounds, args.steps)
    g = torch.randn(2560, device="cuda")
    patched = {k: getattr(torch.Tensor, k) for k in ("cpu", "to", "numpy")}
    for mode in ("patched", "orig", "patched", "orig"):
        torch.Tensor.cpu = patched["cpu"] if mode == "patched" else orig["cpu"]
        t = time.perf_counter()
        for _ in range(20000):
            g.cpu()
        print(f"{mode:<8} small .cpu() (10 KiB): {(time.perf_counter() - t) / 20000 * 1e6:.2f} us", flush=True)
    torch.Tensor.cpu = patched["cpu"]
    return 0


if __name__ == "__main__":
    sys.exit(main())
