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
memory), ``ump-numpy`` (``ump_alloc.enable(torch=False)``: NumPy and the workers on ump-alloc,
PyTorch untouched), ``ump-torch`` (``enable(numpy=False)``: PyTorch on ump-alloc, NumPy
untouched) and ``ump-none`` (the library loaded, neither switched over). Goal: ``ump`` within 1.02x of ``plain``.

    python benches/dataloader_fork_bench.py [--epochs 4] [--variants plain,ump,ump-copy] [--rounds 1]
        [--phases] [--events] [--cpus 0-7] [--start-method fork|forkserver|spawn] [--json out.json]

``--start-method`` chooses the DataLoader's ``multiprocessing_context`` (issue 33: spawn and
forkserver workers that use only NumPy must hold no CUDA context; each row says whether a
worker did).

Each row also gives, per epoch, the time the training loop waited for the DataLoader's next
batch, and the workers' own time making the batches (their samples and collation, summed over
the epoch's batches; collation alone below it); ``--phases`` adds the time of the batches'
copies to the GPU alone (synchronised after each), ``--events`` the loop's host time in the copy
calls and in launching each step, and the GPU's own time for the copies and for the steps (CUDA
events, nothing synchronised: the pipeline's overlap is kept). ``--rounds N`` runs the whole set N times, interleaved (every other
round in reverse order), and gives each variant's median ratio to the same round's ``plain``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import ctypes, json, os, resource, sys, time
if os.environ.get("DL_BENCH_CPUS"):  # --cpus: this process and its workers on these CPUs only
    os.sched_setaffinity(0, {int(c) for c in os.environ["DL_BENCH_CPUS"].split(",")})
import numpy as np
if os.environ.get("DL_BENCH_ENABLE"):  # one library on ump-alloc, the other left alone
    import ump_alloc
    ump_alloc.enable(**{k: v == "1" for k, v in (kv.split("=") for kv in os.environ["DL_BENCH_ENABLE"].split(","))})
import torch, torchvision
from torch.utils.data import DataLoader, Dataset, default_collate

started = [None]   # in each worker: when it began the batch it is making

def context_active():
    # Whether this process holds a CUDA primary context (what costs a process GPU memory),
    # read without making one.
    try:
        cu = ctypes.CDLL("libcuda.so.1")
        flags, active = ctypes.c_uint(), ctypes.c_int()
        return cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value != 0
    except OSError:
        return False

class DS(Dataset):
    # The samples travel with the Dataset: a fork worker shares the parent's array, a spawn or
    # forkserver worker gets a pickled copy (as with any in-memory Dataset).
    def __init__(self, images, labels):
        self.images, self.labels = images, labels
    def __len__(self):
        return len(self.labels)
    def __getitem__(self, i):
        if started[0] is None:
            started[0] = time.perf_counter()
        x = self.images[i].astype(np.float32) / 255.0          # a new array in the worker
        return torch.from_numpy(x), int(self.labels[i])

def collate(batch):
    # The worker's time for this batch (its samples and their collation) travels with it, and
    # whether the worker holds a CUDA context.
    t0 = time.perf_counter()
    x, y = default_collate(batch)
    t1 = time.perf_counter()
    made, started[0] = t1 - started[0], None
    return x, y, made, t1 - t0, context_active()

def main():
    epochs, persistent, pin = int(sys.argv[1]), sys.argv[2] == "1", sys.argv[3] == "1"
    phases, events, method = sys.argv[4] == "1", sys.argv[5] == "1", sys.argv[6]
    n = 300 * 2**20 // (3 * 64 * 64)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (n, 3, 64, 64), dtype=np.uint8)   # 300 MiB, made in the parent
    labels = rng.integers(0, 10, n).astype(np.int64)
    kind = "plain"
    if "ump_alloc" in sys.modules:
        import ump_alloc
        kind = ump_alloc.identify(images).kind

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator(); g.manual_seed(0)
    dl = DataLoader(DS(images, labels), batch_size=256, shuffle=True, generator=g, num_workers=4, pin_memory=pin,
                    persistent_workers=persistent, multiprocessing_context=method, collate_fn=collate)
    # --events: per batch, the loop's own time in the copy calls and in launching the step (host
    # clock), and the GPU's time for the copies and for the step (CUDA events, no synchronisation).
    marks = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(len(dl))] if events else []

    def usage():  # this process's and its reaped children's (the workers of epochs done) CPU and faults
        a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return (a.ru_utime, a.ru_stime, a.ru_minflt, a.ru_nivcsw, b.ru_utime + b.ru_stime, b.ru_minflt)

    times, check, split, worker_ctx = [], 0.0, [], False
    for e in range(epochs):
        torch.cuda.synchronize()
        u0 = usage()
        t = time.perf_counter()
        wait = h2d = made = coll = launch = 0.0
        it = iter(dl)
        b = 0
        while True:
            t0 = time.perf_counter()
            try:
                x, y, m, c, wctx = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            made += m
            coll += c
            worker_ctx = worker_ctx or wctx
            if events:
                marks[b][0].record()
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            if events:
                marks[b][1].record()
            if phases:  # the copies' own time (the synchronisation changes the overlap)
                torch.cuda.synchronize()
            t2 = time.perf_counter()
            h2d += t2 - t1
            wait += t1 - t0
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            if events:
                marks[b][2].record()
            launch += time.perf_counter() - t2
            b += 1
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
        du = [after - before for before, after in zip(u0, usage())]
        gpu_h2d = sum(m[0].elapsed_time(m[1]) for m in marks[:b]) / 1e3 if events else None
        gpu_step = sum(m[1].elapsed_time(m[2]) for m in marks[:b]) / 1e3 if events else None
        split.append({"waiting_for_batches_s": wait, "h2d_s": h2d if phases or events else None,
                      "worker_s": made, "collate_s": coll, "launch_s": launch if events else None,
                      "gpu_h2d_s": gpu_h2d, "gpu_step_s": gpu_step,
                      # The loop's process: user and system CPU time, page faults, involuntary context
                      # switches; the workers reaped in this epoch (all of them unless persistent):
                      # CPU time and page faults.
                      "main_user_s": du[0], "main_sys_s": du[1], "main_faults": du[2], "main_preempted": du[3],
                      "reaped_cpu_s": du[4], "reaped_faults": du[5]})
        check = float(loss.item())
    print(json.dumps({"kind": kind, "epochs_s": times, "split": split, "last_loss": check,
                      "worker_context": worker_ctx, "gpu_mem_mib": torch.cuda.memory_reserved() >> 20}))

if __name__ == "__main__":  # spawn and forkserver workers import this file again
    main()
"""

VARIANTS = {
    "plain": {},
    "ump": {"UMP_ALLOC": "1"},
    "ump-copy": {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "copy"},
    "ump-host": {"UMP_ALLOC": "1", "UMP_ALLOC_HOST_SIDE": "host"},
    "ump-device": {"UMP_ALLOC": "1", "UMP_ALLOC_DEVICE_SIDE": "device"},
    "ump-numpy": {"DL_BENCH_ENABLE": "torch=0"},
    "ump-torch": {"DL_BENCH_ENABLE": "numpy=0"},
    "ump-none": {"DL_BENCH_ENABLE": "numpy=0,torch=0"},
}


def run_one(v: str, persistent: str, pin: str, args, rnd: int) -> dict:
    """One (variant, setting) in a fresh interpreter."""
    from _benchutil import ump_env

    row = {"variant": v, "round": rnd, "persistent": persistent, "pin": pin}
    env = ump_env(VARIANTS[v])
    if args.cpus:
        env["DL_BENCH_CPUS"] = ",".join(map(str, args.cpus))
    r = subprocess.run([sys.executable, _worker_file(), str(args.epochs), persistent, pin,
                        "1" if args.phases else "0", "1" if args.events else "0", args.start_method],
                       env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        return {**row, "error": r.stderr[-2000:]}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    later = sorted(out["epochs_s"][1:]) or out["epochs_s"]
    return {**row, **out, "median_s": later[len(later) // 2]}


def _worker_file() -> str:
    """WORKER as a file: spawn and forkserver workers import the main module by its path."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"dataloader_fork_bench_worker_{os.getpid()}.py")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(WORKER)
    return path


def _cpu_list(text: str) -> list:
    """``0-3,8`` -> [0, 1, 2, 3, 8]."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--variants", default="plain,ump,ump-copy")
    ap.add_argument("--persistent", default="0,1", help="persistent_workers settings to run (0, 1)")
    ap.add_argument("--pin", default="1,0", help="pin_memory settings to run (1, 0)")
    ap.add_argument("--phases", action="store_true",
                    help="also time the batch copies alone (a synchronisation after each: slower epochs)")
    ap.add_argument("--events", action="store_true",
                    help="also give, per epoch, the loop's host time in the copy calls and in launching the "
                         "steps, and the GPU's time for the copies and the steps (CUDA events, no synchronisation)")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every (variant, setting), interleaved")
    ap.add_argument("--cpus", type=_cpu_list, default=None,
                    help="run every variant on these CPUs only (e.g. 0-7): the same CPUs for each process")
    ap.add_argument("--start-method", default="fork", choices=("fork", "forkserver", "spawn"),
                    help="the DataLoader's multiprocessing_context")
    ap.add_argument("--json")
    args = ap.parse_args()
    from _benchutil import gpu_or_skip

    gpu_or_skip("torch", "torchvision")
    rows = []
    variants = args.variants.split(",")
    for rnd in range(args.rounds):  # rounds interleave the variants, in turn forward and backward:
        order = variants if rnd % 2 == 0 else variants[::-1]  # drift and order hit them alike
        for persistent in args.persistent.split(","):
            for pin in args.pin.split(","):
                for v in order:
                    print(f"round {rnd} {v} persistent_workers={persistent} pin_memory={pin} ...",
                          file=sys.stderr, flush=True)
                    row = run_one(v, persistent, pin, args, rnd)
                    rows.append(row)
                    # Each result as it comes (a run cut short keeps what it measured).
                    print(json.dumps({k: row.get(k) for k in ("variant", "round", "persistent", "pin", "median_s",
                                                              "epochs_s", "error")}), file=sys.stderr, flush=True)
    base = {(r["round"], r["persistent"], r["pin"]): r["median_s"]
            for r in rows if r["variant"] == "plain" and "median_s" in r}
    print(f"{'variant':<10} {'round':>5} {'persistent':>10} {'pin':>4} {'kind':<10} {'s/epoch (median)':>17} "
          f"{'vs plain':>9}  epochs")
    for r in rows:
        head = f"{r['variant']:<10} {r['round']:>5} {r['persistent']:>10} {r['pin']:>4}"
        if "error" in r:
            print(f"{head} error: {r['error'][-300:]}")
            continue
        b = base.get((r["round"], r["persistent"], r["pin"]))
        r["vs_plain"] = r["median_s"] / b if b else None
        rel = f"{r['vs_plain']:.3f}x" if b else "-"
        print(f"{head} {r['kind']:<10} {r['median_s']:>17.3f} {rel:>9}  " + " ".join(f"{t:.3f}" for t in r["epochs_s"])
              + f"  [{args.start_method}; workers held a CUDA context: {r.get('worker_context')}; "
              f"GPU memory reserved {r.get('gpu_mem_mib')} MiB]")
        pad = " " * (len(head) + 11)
        for key, label in (("waiting_for_batches_s", "waiting for batches"), ("worker_s", "workers' time"),
                           ("collate_s", "of which collate"), ("h2d_s", "batch copies"),
                           ("launch_s", "launching steps"), ("gpu_h2d_s", "GPU: copies"),
                           ("gpu_step_s", "GPU: steps")):
            if r["split"][0].get(key) is None:
                continue
            print(f"{pad}{label:>17} {'':>9}  " + " ".join(f"{x[key]:.3f}" for x in r["split"]))
    if args.rounds > 1:
        print("\nmedian [geometric mean] over rounds of each round's ratio to plain:")
        groups: dict = {}
        for r in rows:
            if r.get("vs_plain") is not None:
                groups.setdefault((r["variant"], r["persistent"], r["pin"]), []).append(r["vs_plain"])
        for (v, persistent, pin), xs in groups.items():
            xs = sorted(xs)
            geo = math.exp(sum(math.log(x) for x in xs) / len(xs))
            print(f"  {v:<10} persistent={persistent} pin={pin}: {xs[len(xs) // 2]:.3f}x [{geo:.3f}x]  "
                  f"({' '.join(f'{x:.3f}' for x in xs)})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
