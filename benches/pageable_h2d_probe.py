"""One DataLoader batch without ``pin_memory`` (256 x 3 x 64 x 64 float32, 12.6 MB, a CPU tensor
in shared memory: pageable) copied to the GPU with ``.cuda(non_blocking=True)``, 40 times, with a
kernel on each copy: the median copy time (ms) and the kind of memory the GPU tensor got under
ump-alloc (managed, or the device pool with ``UMP_ALLOC_DEVICE_SIDE=device``). Run it plain and
under ``UMP_ALLOC=1`` to compare. Needs a GPU and PyTorch.

    python benches/pageable_h2d_probe.py LABEL
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _benchutil  # noqa: E402 - beside this script


def main() -> None:
    label = _benchutil.label_or_skip(__doc__, "torch")
    import torch

    x = torch.rand(256, 3, 64, 64).share_memory_()
    for _ in range(3):
        y = x.cuda(non_blocking=True)
    torch.cuda.synchronize()
    ts = []
    for _ in range(40):
        t = time.perf_counter()
        y = x.cuda(non_blocking=True)
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t) * 1e3)
        z = y * 2  # a kernel on it, as training does
    torch.cuda.synchronize()
    assert torch.equal(z.cpu(), x * 2)
    ts.sort()
    import ump_alloc

    kind = ump_alloc.identify(y.data_ptr()).kind if ump_alloc.is_enabled() else "-"
    print(label, kind, f"pageable 12.6 MB H2D: median {ts[20]:.2f} ms [{ts[0]:.2f}-{ts[-1]:.2f}]")


if __name__ == "__main__":
    main()
