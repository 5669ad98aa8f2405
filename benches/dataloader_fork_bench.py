"""The input pipeline of issue 20, with and without ump-alloc: a torch ``DataLoader`` with 4
``fork`` workers over a Dataset whose samples live in one 300 MiB NumPy array made in the parent
(uint8 images, 3x64x64), training torchvision's ResNet-18 on the GPU. Every variant sees the same
samples in the same order. Seconds per epoch (median of the epochs after the first), for
``persistent_workers`` False and True and ``pin_memory`` True and False; each (variant,
setting) runs in a fresh interpreter.

Variants (``--variants``): ``plain`` (no ump-alloc), ``ump`` (``UMP_ALLOC=1``: NumPy on pinned
memory shared with fork children, the default), ``ump-copy`` (``UMP_ALLOC_PINNED_FORK=copy``: the
behaviour before issue 20), ``ump-host`` (``UMP_ALLOC_HOST_SIDE=host``), ``ump-device``
(``UMP_ALLOC_DEVICE_SIDE=device``: PyTorch's memory from the device pool instead of managed
memory). Goal: ``ump`` within 1.02x of ``plain``.

    python benches/dataloader_fork_bench.py [--epochs 4] [--variants plain,ump,ump-copy] [--phases] [--json out.json]

Each row also gives, per epoch, the time the training loop waited for the DataLoader's next
batch; ``--phases`` adds the time of the batches' copies to the GPU alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORKER = r'''
import json, sys, time
import numpy as np
import torch, torchvision
from torch.utils.data import DataLoader, Dataset

epochs, persistent, pin = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
phases = sys.argv[4] == "1"
n = 300 * 2**20 // (3 * 64 * 64)
rng = np.random.default_rng(0)
images = rng.integers(0, 256, (n, 3, 64, 64), dtype=np.uint8)   # 300 MiB, made in the parent
labels = rng.integers(0, 10, n).astype(np.int64)
kind = "plain"
if "ump_alloc" in sys.modules:
    import ump_alloc
    kind = ump_alloc.identify(images).kind

class DS(Dataset):
    def __len__(self):
        return n
    def __getitem__(self, i):
        x = images[i].astype(np.float32) / 255.0                # a new array in the worker
        return torch.from_numpy(x), int(labels[i])

torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
g = torch.Generator(); g.manual_seed(0)
dl = DataLoader(DS(), batch_size=256, shuffle=True, generator=g, num_workers=4, pin_memory=pin,
                persistent_workers=persistent, multiprocessing_context="fork")
times, check, split = [], 0.0, []
for e in range(epochs):
    torch.cuda.synchronize()
    t = time.perf_counter()
    wait = h2d = 0.0
    it = iter(dl)
    while True:
        t0 = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter()
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        if phases:  # the copies' own time (the synchronisation changes the overlap)
            torch.cuda.synchronize()
            h2d += time.perf_counter() - t1
        wait += t1 - t0
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
    split.append({"waiting_for_batches_s": wait, "h2d_s": h2d if phases else None})
    check = float(loss.item())
print(json.dumps({"kind": kind, "epochs_s": times, "split": split, "last_loss": check}))
'''

VARIANTS = {
    "plain": {},
    "ump": {"UMP_ALLOC": "1"},
    "ump-copy": {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "copy"},
    "ump-host": {"UMP_ALLOC": "1", "UMP_ALLOC_HOST_SIDE": "host"},
    "ump-device": {"UMP_ALLOC": "1", "UMP_ALLOC_DEVICE_SIDE": "device"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--variants", default="plain,ump,ump-copy")
    ap.add_argument("--persistent", default="0,1", help="persistent_workers settings to run (0, 1)")
    ap.add_argument("--pin", default="1,0", help="pin_memory settings to run (1, 0)")
    ap.add_argument("--phases", action="store_true",
                    help="also time the batch copies alone (a synchronisation after each: slower epochs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    from _benchutil import gpu_or_skip, ump_env

    gpu_or_skip("torch", "torchvision")
    rows = []
    for persistent in args.persistent.split(","):
        for pin in args.pin.split(","):
            for v in args.variants.split(","):
                print(f"{v} persistent_workers={persistent} pin_memory={pin} ...", file=sys.stderr, flush=True)
                env = ump_env(VARIANTS[v])
                r = subprocess.run([sys.executable, "-c", WORKER, str(args.epochs), persistent, pin,
                                    "1" if args.phases else "0"], env=env,
                                   capture_output=True, text=True, timeout=1800)
                if r.returncode != 0:
                    rows.append({"variant": v, "persistent": persistent, "pin": pin, "error": r.stderr[-2000:]})
                    continue
                out = json.loads(r.stdout.strip().splitlines()[-1])
                later = sorted(out["epochs_s"][1:]) or out["epochs_s"]
                out["median_s"] = later[len(later) // 2]
                rows.append({"variant": v, "persistent": persistent, "pin": pin, **out})
    base = {(r["persistent"], r["pin"]): r["median_s"] for r in rows if r["variant"] == "plain" and "median_s" in r}
    print(f"{'variant':<9} {'persistent':>10} {'pin':>4} {'kind':<10} {'s/epoch (median)':>17} {'vs plain':>9}  epochs")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:<9} {r['persistent']:>10} {r['pin']:>4} error: {r['error'][-300:]}")
            continue
        b = base.get((r["persistent"], r["pin"]))
        rel = f"{r['median_s'] / b:.3f}x" if b else "-"
        print(f"{r['variant']:<9} {r['persistent']:>10} {r['pin']:>4} {r['kind']:<10} {r['median_s']:>17.3f} {rel:>9}  "
              + " ".join(f"{t:.3f}" for t in r["epochs_s"]))
        print(f"{'':<9} {'':>10} {'':>4} {'':<10} {'waiting for batches':>17} {'':>9}  "
              + " ".join(f"{x['waiting_for_batches_s']:.3f}" for x in r["split"]))
        if args.phases:
            print(f"{'':<9} {'':>10} {'':>4} {'':<10} {'batch copies':>17} {'':>9}  "
                  + " ".join(f"{x['h2d_s']:.3f}" for x in r["split"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
