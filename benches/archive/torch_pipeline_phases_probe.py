"""Where the PyTorch twin of pipeline_bench.py spends its time, phase by phase: NumPy
pre-processing of a 256 MiB float32 array (``raw * 0.5 + 1.0``), ``torch.from_numpy(h).cuda()``,
three kernels, ``.cpu().numpy()``, a strided host read. Run it once plain and once under
``UMP_ALLOC=1``; it prints the median of 12 iterations per phase (ms) and, under ump-alloc, the
kind of memory each array got. Needs a GPU, PyTorch and NumPy.

    python benches/archive/torch_pipeline_phases_probe.py LABEL
    UMP_ALLOC=1 python benches/archive/torch_pipeline_phases_probe.py LABEL
"""

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
import _benchutil  # noqa: E402 - benches/_benchutil.py


def main() -> None:
    label = _benchutil.label_or_skip(__doc__, "torch")
    import torch

    n = 256 * 2**20 // 4
    raw = np.random.default_rng(0).random(n, dtype=np.float32)
    ph = {k: [] for k in ("pre", "to_gpu", "kernels", "to_host", "read")}

    def step(rec):
        t0 = time.perf_counter()
        h = raw * 0.5 + 1.0
        t1 = time.perf_counter()
        t = torch.from_numpy(h).cuda()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        t = torch.sqrt(t)
        t *= 3.0
        t += 1.0
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        r = t.cpu().numpy()
        t4 = time.perf_counter()
        float(r[::1024].sum())
        t5 = time.perf_counter()
        if rec:
            for k, a, b in zip(ph, (t0, t1, t2, t3, t4), (t1, t2, t3, t4, t5)):
                ph[k].append((b - a) * 1e3)
        return h, r

    for i in range(14):
        h, r = step(i >= 2)
    want = np.sqrt(raw[:4096] * 0.5 + 1.0) * 3.0 + 1.0
    assert np.allclose(r[:4096], want, rtol=1e-5), "the pipeline computed something else"
    info = {}
    import ump_alloc

    if ump_alloc.is_enabled():
        info = {name: ump_alloc.identify(a).kind for name, a in (("raw", raw), ("h", h), ("r", r))}
    med = {k: sorted(v)[len(v) // 2] for k, v in ph.items()}
    print(label, {k: round(v, 1) for k, v in med.items()}, "total", round(sum(med.values()), 1), info)


if __name__ == "__main__":
    main()
