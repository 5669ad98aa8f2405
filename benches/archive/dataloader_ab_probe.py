"""``dataloader_fork_bench.py``'s pipeline (4 ``fork`` workers, ``persistent_workers`` and
``pin_memory`` False unless ``--persistent`` / ``--pin``, a 300 MiB uint8 dataset made in the
parent, ResNet-18 on the GPU) with plain and ump-alloc epochs alternating *in one process*, so
that the machine's drift from one process to the next (10-25 % on the lent H100) drops out of
the comparison.

The process holds the dataset twice, once in NumPy's own memory and once on ump-alloc's host
side (pinned, shared with fork children). A ``plain`` epoch reads the first with ump-alloc
disabled; a ``ump`` epoch reads the second inside ``ump_alloc.enabled(torch=...)``, so the
workers forked for it allocate from ump-alloc too. With ``--torch`` PyTorch's new segments
come from ump-alloc in ``ump`` epochs as well, and the model those epochs train was made there
too (each mode trains a model of its own, alike at the start, on a CUDA stream of its own, so
that PyTorch's cache never hands one mode's blocks to the other); without it PyTorch stays on
its own allocator throughout. Needs a GPU, PyTorch and torchvision (``--workers-only``: PyTorch).

    python benches/archive/dataloader_ab_probe.py [--epochs 6] [--torch] [--start ump] [--persistent] [--pin]
        [--workers-only] [--start-method fork|spawn|forkserver]

``--start-method spawn`` or ``forkserver`` (issue 33): the workers start clean and get the
Dataset pickled (each its own copy of the 300 MiB, made in the worker), as with any in-memory
Dataset under those start methods. The worker's ump-alloc comes from its environment, as it
would for a user: a ``ump`` epoch's workers start with ``UMP_ALLOC=1`` and a ``plain`` epoch's
without it. Spawn reads the environment at each start; forkserver workers are forked from a
server that was started with it, so the probe keeps one server per mode, both started before
the first epoch, and starts each worker from its mode's server.

Prints each epoch (seconds, the workers' time for their samples, wall and CPU, and for
collation, summed over the epoch's batches, and whose memory the workers' samples are and
whether a worker held a CUDA context) and the median epoch of each mode with their ratio;
the first epoch of each mode is a warm-up and left out. ``--workers-only`` leaves out the model
and the GPU (the loop only takes the batches): the workers' side alone, on any machine with
PyTorch (where no GPU reaches NumPy's memory the host side is plain aligned memory).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/, for _benchutil

# Module level, so that spawn and forkserver workers unpickle them: the Dataset carries its
# samples (a fork worker shares the parent's array, a spawn or forkserver worker gets a copy).
_mark = {"started": None, "cpu": 0.0}  # in each worker: when it began the batch it is making


def _context_active():
    """Whether this process holds a CUDA primary context on device 0 (what costs a process GPU
    memory), asked without making one: before ``cuInit`` the driver answers not-initialised."""
    import ctypes

    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    flags, active = ctypes.c_uint(), ctypes.c_int()
    return cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0 and active.value != 0


class DS:
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        import numpy as np
        import torch

        if _mark["started"] is None:
            _mark["started"], _mark["cpu"] = time.perf_counter(), time.thread_time()
        if "kind" not in _mark:  # whose memory this worker's copy of the samples is
            ump = sys.modules.get("ump_alloc")
            _mark["kind"] = ump.identify(self.images).kind if ump else "ump_alloc not loaded"
        x = self.images[i].astype(np.float32) / 255.0  # a new array in the worker
        return torch.from_numpy(x), int(self.labels[i])


def collate(batch):
    # The worker's time for this batch travels with it: its samples (wall and CPU time: the CPU
    # time leaves out the moments other processes had the core) and the collation.
    from torch.utils.data import default_collate

    t0, c0 = time.perf_counter(), time.thread_time()
    x, y = default_collate(batch)
    t1 = time.perf_counter()
    samples, samples_cpu, _mark["started"] = t0 - _mark["started"], c0 - _mark["cpu"], None
    # Whether this worker holds a CUDA context (asked at each batch, after the time is taken:
    # a context made late shows too).
    _mark["context"] = _mark.get("context") or _context_active()
    return x, y, samples, samples_cpu, t1 - t0, _mark["kind"] + ("; CUDA context" if _mark["context"] else "")


class WorkerEnv:
    """Starts each mode's workers with that mode's environment: ``UMP_ALLOC=1`` for ``ump``,
    none for ``plain``. Under forkserver there is one server per mode (a worker is forked from
    the server and inherits the server's environment, not the parent's at the time)."""

    def __init__(self, method):
        self.method, self.mode = method, "plain"
        if method != "forkserver":
            return
        import multiprocessing.forkserver as fs

        self.servers = {m: fs.ForkServer() for m in ("plain", "ump")}
        for m, server in self.servers.items():
            with self.env(m):
                server.ensure_running()
        # popen_forkserver starts every process through this module-level name (the default
        # server's method): each worker comes from the server of the mode that starts it.
        fs.connect_to_new_process = lambda fds: self.servers[self.mode].connect_to_new_process(fds)

    @contextlib.contextmanager
    def env(self, mode):
        old, self.mode = os.environ.pop("UMP_ALLOC", None), mode
        if mode == "ump":
            os.environ["UMP_ALLOC"] = "1"
        try:
            yield
        finally:
            os.environ.pop("UMP_ALLOC", None)
            if old is not None:
                os.environ["UMP_ALLOC"] = old


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6, help="epochs per mode (the first of each is a warm-up)")
    ap.add_argument("--torch", action="store_true", help="PyTorch on ump-alloc too in ump epochs")
    ap.add_argument("--start", choices=("plain", "ump"), default="plain")
    ap.add_argument("--persistent", action="store_true", help="persistent_workers=True (one DataLoader per mode)")
    ap.add_argument("--pin", action="store_true", help="pin_memory=True")
    ap.add_argument("--workers-only", action="store_true",
                    help="no model and no GPU: the loop only takes the batches (the workers' side alone)")
    ap.add_argument("--start-method", choices=("fork", "spawn", "forkserver"), default="fork",
                    help="the DataLoader's multiprocessing_context")
    args = ap.parse_args()
    import _benchutil

    if args.workers_only:
        _benchutil.modules_or_skip("torch")
    else:
        _benchutil.gpu_or_skip("torch", "torchvision")
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    import ump_alloc

    n = 300 * 2**20 // (3 * 64 * 64)
    rng = np.random.default_rng(0)
    plain_images = rng.integers(0, 256, (n, 3, 64, 64), dtype=np.uint8)
    with ump_alloc.enabled(torch=False):
        ump_images = plain_images.copy()
    labels = rng.integers(0, 10, n).astype(np.int64)
    datasets = {"plain": DS(plain_images, labels), "ump": DS(ump_images, labels)}
    workers = WorkerEnv(args.start_method)

    loss_fn = torch.nn.CrossEntropyLoss()

    def make_model(mode):
        if args.workers_only:
            return None
        import torchvision

        with torch.cuda.stream(streams[mode]):
            torch.manual_seed(0)
            m = torchvision.models.resnet18(num_classes=10).cuda()
            return m, torch.optim.SGD(m.parameters(), lr=0.01)

    # Each mode trains a model of its own, alike at the start, on a CUDA stream of its own:
    # PyTorch's caching allocator never hands a block cached for one stream to another, so with
    # --torch everything the ump epochs allocate (model, gradients, activations, batches) lies in
    # segments PyTorch took from ump-alloc, as under UMP_ALLOC=1, and the plain epochs' in
    # PyTorch's own.
    streams = {} if args.workers_only else {"plain": torch.cuda.Stream(), "ump": torch.cuda.Stream()}

    models = {"plain": make_model("plain")}
    with ump_alloc.enabled(torch=args.torch):
        models["ump"] = make_model("ump")

    loaders = {}

    def loader(mode, seed):
        """A new DataLoader per epoch, or with --persistent one per mode (its workers are forked
        at its first epoch, in that mode, and kept); either way both modes see the same samples."""
        if args.persistent and mode in loaders:
            return loaders[mode]
        g = torch.Generator()
        g.manual_seed(seed)
        dl = DataLoader(datasets[mode], batch_size=256, shuffle=True, generator=g, num_workers=4,
                        pin_memory=args.pin, persistent_workers=args.persistent,
                        multiprocessing_context=args.start_method, collate_fn=collate)
        if args.persistent:
            loaders[mode] = dl
        return dl

    def epoch(mode, seed):
        """One epoch: seconds, and the workers' sample time (wall, CPU) and collation time."""
        dl = loader(mode, seed)
        if not args.workers_only:
            torch.cuda.synchronize()
        t = time.perf_counter()
        samples = samples_cpu = coll = 0.0
        kinds = set()
        with workers.env(mode):
            batches = iter(dl)  # starts the workers (with --persistent, at the mode's first epoch)
        with contextlib.nullcontext() if args.workers_only else torch.cuda.stream(streams[mode]):
            for x, y, s_wall, s_cpu, c, k in batches:
                kinds.add(k)
                samples += s_wall
                samples_cpu += s_cpu
                coll += c
                if args.workers_only:
                    continue
                model, opt = models[mode]
                x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
        if not args.workers_only:
            torch.cuda.synchronize()
        return time.perf_counter() - t, samples, samples_cpu, coll, ",".join(sorted(kinds))

    order = ["plain", "ump"] if args.start == "plain" else ["ump", "plain"]
    got = {"plain": [], "ump": []}

    def kind(ptr):
        return ump_alloc.identify(ptr).kind

    for mode, images in (("plain", plain_images), ("ump", ump_images)):
        model = "none" if models[mode] is None else kind(next(models[mode][0].parameters()).data_ptr())
        print(f"{mode} epochs: dataset {kind(images)}, model {model}")
    print(f"PyTorch on ump-alloc in ump epochs: {args.torch}; persistent_workers={args.persistent}, "
          f"pin_memory={args.pin}, start method {args.start_method}")
    print(f"{'epoch':>5} {'mode':<6} {'s':>7} {'samples s':>10} {'(CPU s)':>8} {'collate s':>10}  workers' samples")
    for e in range(2 * args.epochs):
        mode = order[e % 2]
        if mode == "ump":
            with ump_alloc.enabled(torch=args.torch):
                r = epoch(mode, e // 2)
        else:
            r = epoch(mode, e // 2)
        if e >= 2:
            got[mode].append(r)
        print(f"{e:>5} {mode:<6} {r[0]:>7.3f} {r[1]:>10.3f} {r[2]:>8.3f} {r[3]:>10.3f}  {r[4]}", flush=True)
    p, u = (statistics.median(r[0] for r in got[m]) for m in ("plain", "ump"))
    pc, uc = (statistics.median(r[2] for r in got[m]) for m in ("plain", "ump"))
    print(f"median epoch: plain {p:.3f} s, ump {u:.3f} s: ump / plain = {u / p:.3f}x")
    print(f"median of the workers' sample CPU time: plain {pc:.3f} s, ump {uc:.3f} s: ump / plain = {uc / pc:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
