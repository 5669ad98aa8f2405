"""PyTorch training loops on every route, side by side: time per step, the final loss and the
peak memory held from the driver. Each run is a fresh process (PyTorch's allocator is fixed per
process); the configurations take turns, round after round, so drift hits them alike.

    python3 benches/torch_training_bench.py                        # both models, every route
    python3 benches/torch_training_bench.py --models resnet50 --rounds 5
    python3 benches/torch_training_bench.py --run gpt2 --config segments   # one run, JSON

Models (random data, fixed seeds, the same for every configuration):
- resnet50: torchvision ResNet-50, batch 64 at 224x224, SGD, bf16 autocast;
- gpt2: transformers' GPT-2 (6 layers, 768 wide, 12 heads, random weights; no download),
  batch 8 x 512 tokens, AdamW, bf16 autocast;
- resnet18: torchvision ResNet-18, batch 256 at 64x64, float32, SGD: the DataLoader pipeline's
  model and step (dataloader_fork_bench.py) without the loader, whose pace the host's kernel
  launches set (not in the default set).

Configurations:
- plain: no ump-alloc;
- segments: UMP_ALLOC=1 (the default route: PyTorch's caching allocator on top, ump-alloc's
  managed memory below);
- segments-device: the same with UMP_ALLOC_DEVICE_SIDE=device (plain device memory from the
  virtual-memory pool);
- swap: UMP_ALLOC=1 UMP_ALLOC_TORCH_ROUTE=swap (ump-alloc instead of PyTorch's allocator).

Reported: median ms per step over the rounds with the spread (min-max), the ratio to plain's
median, the loss after the timed steps (must match plain), and the peak memory held from the
driver (PyTorch's max_memory_reserved; on the ump-alloc routes also ump-alloc's mapped_peak,
the physical memory its pools held).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIGS = {
    "plain": {},
    "segments": {"UMP_ALLOC": "1"},
    "segments-device": {"UMP_ALLOC": "1", "UMP_ALLOC_DEVICE_SIDE": "device"},
    "swap": {"UMP_ALLOC": "1", "UMP_ALLOC_TORCH_ROUTE": "swap"},
}
WARMUP, STEPS = 15, 40


def _resnet50(torch):
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(64, 3, 224, 224, device="cuda", generator=g)
    y = torch.randint(0, 1000, (64,), device="cuda", generator=g)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(m(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, m


def _gpt2(torch):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=6, n_embd=768, n_head=12, n_positions=512, vocab_size=50257)
    m = GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (8, 512), device="cuda", generator=g)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    return step, m


def _resnet18(torch):
    """The DataLoader pipeline's model and step (dataloader_fork_bench.py) without the loader:
    float32, 256 images of 64x64, a step short enough that the host's launches set its pace."""
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(256, 3, 64, 64, device="cuda", generator=g)
    y = torch.randint(0, 10, (256,), device="cuda", generator=g)
    lossf = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = lossf(m(x), y)
        loss.backward()
        opt.step()
        return loss

    return step, m


MODELS = {"resnet50": _resnet50, "gpt2": _gpt2, "resnet18": _resnet18}
STEPS_OF = {"resnet18": 200}  # short steps: more of them


def run_one(model: str) -> dict:
    import torch

    route = "plain"
    if os.environ.get("UMP_ALLOC") == "1":
        import ump_alloc
        from _benchutil import torch_route

        route = torch_route()
    step, module = MODELS[model](torch)
    for _ in range(WARMUP):
        step()
    torch.cuda.synchronize()
    steps = STEPS_OF.get(model, STEPS)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / steps * 1e3
    cpu_ms = (time.process_time() - c0) / steps * 1e3  # every thread of the process
    out = {"model": model, "route": route, "ms_per_step": ms, "cpu_ms_per_step": cpu_ms, "loss": float(loss)}
    if route in ("plain", "segments"):
        out["max_reserved"] = torch.cuda.max_memory_reserved()
    if route is None:
        # UMP_ALLOC=1, but ump-alloc does not serve PyTorch here (the import hook is not
        # installed, or the route fell back): say so rather than read device figures it lacks.
        out["route"] = "not served"
    elif route != "plain":
        d = ump_alloc.stats()["devices"].get(0, {})
        out["ump_mapped_peak"] = d.get("mapped_peak", 0)
        out["weights_ours"] = ump_alloc.identify(next(module.parameters())).ours
    return out


def run_in_child(model: str, config: str) -> dict:
    from _benchutil import ump_env

    env = ump_env(CONFIGS[config])
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--run", model, "--config", config],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise RuntimeError(f"{model}/{config} failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet50,gpt2")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--rounds", type=int, default=3, help="runs of each configuration, in turn")
    ap.add_argument("--run", metavar="MODEL", help="one run in this process (JSON on stdout)")
    ap.add_argument("--config", help="with --run: the configuration (read from the environment)")
    ap.add_argument("--json", metavar="FILE", help="also write every run to FILE")
    args = ap.parse_args()
    if args.run:
        print(json.dumps(run_one(args.run)))
        return
    from _benchutil import gpu_or_skip

    models = args.models.split(",")
    gpu_or_skip("torch", "torchvision" if {"resnet50", "resnet18"} & set(models) else "torch", "transformers" if "gpt2" in models else "torch")
    configs = args.configs.split(",")
    runs = {(m, c): [] for m in models for c in configs}
    for rnd in range(args.rounds):
        for m in models:
            for c in configs:
                print(f"[{rnd + 1}/{args.rounds}] {m} {c} ...", file=sys.stderr, flush=True)
                runs[(m, c)].append(run_in_child(m, c))
    import statistics as st

    print(f"{'model':9} {'config':16} {'ms/step median':>14} {'min-max':>15} {'vs plain':>9} {'CPU ms/step':>11} "
          f"{'loss':>8} {'max reserved':>13} {'ump mapped peak':>16}")
    for m in models:
        base = st.median(r["ms_per_step"] for r in runs[(m, "plain")]) if (m, "plain") in runs else None
        for c in configs:
            rs = runs[(m, c)]
            t = [r["ms_per_step"] for r in rs]
            med = st.median(t)
            rel = f"{med / base:.3f}x" if base else "-"
            res = rs[-1].get("max_reserved")
            ump = rs[-1].get("ump_mapped_peak")
            cpu = st.median(r["cpu_ms_per_step"] for r in rs)
            print(
                f"{m:9} {c:16} {med:14.2f} {min(t):7.2f}-{max(t):<7.2f} {rel:>9} {cpu:11.2f} {rs[-1]['loss']:8.4f} "
                f"{(res or 0) / 2**20:10.0f} MiB {(ump or 0) / 2**20:13.0f} MiB"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{m}/{c}": v for (m, c), v in runs.items()}, f, indent=1)


if __name__ == "__main__":
    main()
