"""One DataLoader batch without ``pin_memory`` (256 x 3 x 64 x 64 float32, 12.6 MB, a CPU tensor
in shared memory: pageable) copied to the GPU with ``.cuda(non_blocking=True)``, then the first
kernel on the copy (a sum): each timed alone (synchronised), 40 times, a fresh shared-memory batch
each time, as a DataLoader hands them over. Prints the median copy time, the median time of the
kernel on the copy and of the same kernel on a tensor already on the GPU (ms), and the kind of
memory the copy got under ump-alloc (managed, or the device pool with
``UMP_ALLOC_DEVICE_SIDE=device``). A kernel on the copy slower than on the resident tensor means
the copy left the pages away from the GPU (the kernel migrates them back). Run it plain and under
``UMP_ALLOC=1`` to compare. Needs a GPU and PyTorch.

    python benches/archive/pageable_h2d_probe.py LABEL
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
import _benchutil  # noqa: E402 - benches/_benchutil.py


def main() -> None:
    label = _benchutil.label_or_skip(__doc__, "torch")
    import torch

    def batch():
        return torch.rand(256, 3, 64, 64).share_memory_()

    resident = torch.rand(256, 3, 64, 64, device="cuda")
    for _ in range(3):
        y = batch().cuda(non_blocking=True)
        y.sum()
    torch.cuda.synchronize()
    copy, first, again, base = [], [], [], []
    for _ in range(40):
        x = batch()
        t = time.perf_counter()
        y = x.cuda(non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        s = y.sum()  # the first kernel on the copy, as training's first layer
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        s2 = y.sum()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        resident.sum()
        torch.cuda.synchronize()
        t4 = time.perf_counter()
        copy.append((t1 - t) * 1e3)
        first.append((t2 - t1) * 1e3)
        again.append((t3 - t2) * 1e3)
        base.append((t4 - t3) * 1e3)
        # The copy is right (not zeros: random data), and both sums agree.
        assert torch.allclose(s, x.sum().cuda(), rtol=1e-4) and torch.equal(s, s2)
    assert torch.equal(y.cpu(), x)
    import ump_alloc

    kind = ump_alloc.identify(y.data_ptr()).kind if ump_alloc.is_enabled() else "-"

    def med(xs):
        xs = sorted(xs)
        return f"{xs[len(xs) // 2]:.3f} [{xs[0]:.3f}-{xs[-1]:.3f}]"

    print(label, kind, f"pageable 12.6 MB H2D: median {med(copy)} ms; first kernel on the copy {med(first)} ms, "
          f"again {med(again)} ms, on a resident tensor {med(base)} ms")


if __name__ == "__main__":
    main()
