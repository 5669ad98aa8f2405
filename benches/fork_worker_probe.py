"""A DataLoader worker's own work, without the DataLoader: a process that has a CUDA context
(a PyTorch tensor on the GPU) makes a 300 MiB uint8 image array (3x64x64 samples), forks, and
the child makes 6400 samples as ``dataloader_fork_bench.py``'s Dataset does
(``images[i].astype(np.float32) / 255.0``, then ``torch.from_numpy``) and collates them 256 at a
time (``torch.stack``). The parent does the same before the fork. Seconds per pass: the
parent's, the child's first pass (its first touch of the inherited pages) and its later passes.

Variants (each in a fresh interpreter, alternated ``--rounds`` times): ``plain``, ``ump``
(``UMP_ALLOC=1``), ``ump-host`` (``UMP_ALLOC_HOST_SIDE=host``), ``ump-copy``
(``UMP_ALLOC_PINNED_FORK=copy``). Needs a GPU and PyTorch.

    python benches/fork_worker_probe.py [--variants plain,ump,ump-host] [--rounds 3] [--samples 6400]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHILD = r'''
import json, os, sys, time
import numpy as np
import torch

samples = int(sys.argv[1])
torch.ones(1, device="cuda").sum().item()          # a CUDA context, as the training process has
n = 300 * 2**20 // (3 * 64 * 64)
images = np.random.default_rng(0).integers(0, 256, (n, 3, 64, 64), dtype=np.uint8)
order = np.random.default_rng(1).permutation(n)[:samples]
kind = "plain"
if "ump_alloc" in sys.modules:
    import ump_alloc
    kind = ump_alloc.identify(images).kind

def one_pass():
    t = time.perf_counter()
    check = 0.0
    for b in range(0, samples, 256):
        batch = [torch.from_numpy(images[i].astype(np.float32) / 255.0) for i in order[b:b + 256]]
        check += float(torch.stack(batch)[:, 0, 0, 0].sum())
    return time.perf_counter() - t, check

parent = [one_pass() for _ in range(2)]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    out = [one_pass() for _ in range(3)]
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
_, status = os.waitpid(pid, 0)
child = json.loads(data)
assert status == 0 and all(abs(c - parent[0][1]) < 1e-3 * abs(parent[0][1]) for _, c in child), (status, child, parent)
print(json.dumps({"kind": kind, "parent_s": [p[0] for p in parent], "child_s": [c[0] for c in child]}))
'''

VARIANTS = {
    "plain": {},
    "ump": {"UMP_ALLOC": "1"},
    "ump-host": {"UMP_ALLOC": "1", "UMP_ALLOC_HOST_SIDE": "host"},
    "ump-copy": {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "copy"},
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="plain,ump,ump-host")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=6400)
    args = ap.parse_args()
    from _benchutil import gpu_or_skip, ump_env

    gpu_or_skip("torch")
    print(f"{'variant':<12} {'kind':<11} {'parent pass, s':>15} {'child 1st pass':>15} {'child later':>12}")
    for rnd in range(args.rounds):
        for v in args.variants.split(","):
            r = subprocess.run([sys.executable, "-c", CHILD, str(args.samples)], env=ump_env(VARIANTS[v]),
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                print(f"{v:<12} error: {r.stderr[-500:]}")
                continue
            out = json.loads(r.stdout.strip().splitlines()[-1])
            later = sorted(out["child_s"][1:])
            print(f"{v:<12} {out['kind']:<11} {min(out['parent_s']):>15.3f} {out['child_s'][0]:>15.3f} "
                  f"{later[0]:>12.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
