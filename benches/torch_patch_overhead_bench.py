"""The overhead of ump-alloc's PyTorch transfer patch on a training loop, in one process.

A small MLP trains with a ``loss.item()`` and a ``logits.detach().cpu()`` per step (the calls the
patch intercepts). Rounds alternate between the patched ``Tensor.cpu``/``to``/``numpy`` and
PyTorch's own methods in the same process (so that machine and process noise hit both alike);
the medians are compared. It also counts the intercepted calls per step and times a small
``.cpu()`` both ways.

    UMP_ALLOC_LIBRARY=... python benches/torch_patch_overhead_bench.py

Exits 0 with a message without a GPU or PyTorch.
"""
import statistics
import sys
import time

try:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device")
except Exception as e:  # noqa: BLE001
    print(f"skipped: no PyTorch GPU ({e})")
    sys.exit(0)
import ump_alloc
from ump_alloc import _torch_transfer as tt

ump_alloc.enable(cupy=False, torch=True)
assert tt._orig, "patch not installed"
patched = {k: getattr(torch.Tensor, k) for k in ("cpu", "to", "numpy")}
counts = {k: 0 for k in patched}
def counting(k):
    f = patched[k]
    def wrap(*a, **kw):
        counts[k] += 1
        return f(*a, **kw)
    return wrap
for k in patched: setattr(torch.Tensor, k, counting(k))
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
train(10)
print("calls per 10 steps:", counts)
def use(mode):
    src = patched if mode == "patched" else tt._orig
    for k in patched: setattr(torch.Tensor, k, src[k])
rates = {"patched": [], "orig": []}
train(50)
for r in range(6):
    for mode in ("patched", "orig"):
        use(mode)
        torch.cuda.synchronize(); t = time.perf_counter(); train(300); torch.cuda.synchronize()
        rates[mode].append(300 / (time.perf_counter() - t))
print("steps/s", {k: round(statistics.median(v), 1) for k, v in rates.items()}, rates)
g = torch.randn(2560, device="cuda")
for mode in ("patched", "orig", "patched", "orig"):
    use(mode)
    t = time.perf_counter()
    for _ in range(20000): g.cpu()
    print(mode, "small .cpu() us", round((time.perf_counter() - t) / 20000 * 1e6, 2))
