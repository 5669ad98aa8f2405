"""Checks on two GPUs (issue 34), each run in a fresh interpreter by test_two_gpus.py:
``python -c "import two_gpu_checks as t; t.NAME()"`` with the settings under test in the
environment. Random data, poisoned outputs, float64 references on the host; each prints
``PASS`` or raises. Every check that guards against a violation has a control (``*_control``)
that shows the violation on memory without the property."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

PEER_READ = r"""
extern "C" __global__ void peer_read(const double *a, double *out, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] * 2.0 + 1.0;
}
"""


def _peer_kernel_read(cp, src_ptr, n, host_ref):
    """A kernel on device 0 reads `n` doubles at `src_ptr` (memory of device 1) into a poisoned
    device-0 array; the result must be 2*x+1 of the reference."""
    with cp.cuda.Device(0):
        out = cp.full(n, -7.0)
        k = cp.RawKernel(PEER_READ, "peer_read")
        k(((n + 255) // 256,), (256,), (cp.uint64(src_ptr), out, cp.int64(n)))
        cp.cuda.Device(0).synchronize()
        got = out.get()
    np.testing.assert_allclose(got, host_ref * 2 + 1, rtol=0, atol=0)


def vmm_peer_access():
    """UMP_ALLOC_DEVICE_SIDE=device (the virtual-memory pool): memory of device 1 is reachable
    from device 0 as cudaMalloc memory is once peer access is on: PyTorch's .to('cuda:0') and a
    sum with a cuda:0 tensor, CuPy's copy across devices, and a raw kernel on device 0 reading
    it; a grown pool's new chunks too."""
    import cupy as cp
    import torch

    import ump_alloc

    assert torch.cuda.device_count() >= 2
    rng = np.random.default_rng(int.from_bytes(os.urandom(3), "little"))
    torch.manual_seed(int(rng.integers(1 << 30)))
    x = torch.randn(4 << 20, device="cuda:1")
    y = torch.randn(4 << 20, device="cuda:0")
    assert ump_alloc.identify(x).ours and ump_alloc.identify(x).device == 1, ump_alloc.identify(x)
    assert ump_alloc.identify(x).kind == "device", ump_alloc.identify(x)
    got = float((x.to("cuda:0") + y).double().sum())
    want = float((x.cpu().double() + y.cpu().double()).sum())
    assert abs(got - want) <= 1e-6 * abs(want) + 1e-2, (got, want)
    # CuPy: arrays on device 1 from ump-alloc, copied to device 0, and read by a device-0 kernel.
    for n in (1 << 20, 48 << 20):  # the second grows the pool by a chunk of its own
        h = rng.standard_normal(n)
        with cp.cuda.Device(1):
            a1 = cp.full(n, -1.0)
            a1[...] = cp.asarray(h)
            ident = ump_alloc.identify(a1)
            assert ident.ours and ident.device == 1 and ident.kind == "device", ident
        with cp.cuda.Device(0):
            a0 = cp.empty_like(a1)
            a0.data.copy_from_device(a1.data, a1.nbytes)  # cudaMemcpy across devices
            np.testing.assert_array_equal(a0.get(), h)
        _peer_kernel_read(cp, a1.data.ptr, n, h)
    print("device-pool memory of device 1 read from device 0: .to(), copies, peer kernel")
    print("PASS")


def vmm_peer_access_control():
    """Control: memory of device 1 that device 0 was never given access to (a virtual-memory
    range of the test's own with only device 1 in its access list) faults when a device-0
    kernel reads it: the check above can fail."""
    import cupy as cp
    from cuda.bindings import driver as drv

    n = 1 << 20
    with cp.cuda.Device(1):
        prop = drv.CUmemAllocationProp()
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = 1
        err, gran = drv.cuMemGetAllocationGranularity(
            prop, drv.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        size = ((n * 8 + gran - 1) // gran) * gran
        err, ptr = drv.cuMemAddressReserve(size, 0, 0, 0)
        err, h = drv.cuMemCreate(size, prop, 0)
        (err,) = drv.cuMemMap(ptr, size, 0, h, 0)
        desc = drv.CUmemAccessDesc()
        desc.location = prop.location
        desc.flags = drv.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        (err,) = drv.cuMemSetAccess(ptr, size, [desc], 1)
        assert int(err) == 0, err
    try:
        _peer_kernel_read(cp, int(ptr), n, np.zeros(n))
    except Exception as e:  # noqa: BLE001 - the violation shows as a CUDA error
        print("device 0 could not read it:", str(e).splitlines()[0][:120])
        print("PASS")
        return
    raise AssertionError("a device-0 kernel read memory it was given no access to")


def peer_copy_bandwidth():
    """Peer copies of 1 GiB between device-pool memory on the two GPUs against the same copy
    between cudaMalloc memory (peer access on), timed with events, median of 10, side by side
    in one process: prints one JSON line (docs/BENCHMARKS.md)."""
    import cupy as cp

    import ump_alloc
    from ump_alloc import _lib

    n = 1 << 30
    L = _lib.lib()
    res = {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            for peer in (0, 1):
                if peer != d and cp.cuda.runtime.deviceCanAccessPeer(d, peer):
                    try:
                        cp.cuda.runtime.deviceEnablePeerAccess(peer)
                    except cp.cuda.runtime.CUDARuntimeError:
                        pass
    ours = [L.ump_cupy_malloc(None, n, d) for d in (0, 1)]
    assert all(ours), _lib.last_error()
    assert ump_alloc.identify(ours[0]).kind == "device" and ump_alloc.identify(ours[1]).device == 1
    plain = []
    for d in (0, 1):
        with cp.cuda.Device(d):
            plain.append(cp.cuda.runtime.malloc(n))

    def timed(dst, src):
        with cp.cuda.Device(0):
            s, e = cp.cuda.Event(), cp.cuda.Event()
            times = []
            for _ in range(12):
                s.record()
                cp.cuda.runtime.memcpyPeerAsync(dst, 0, src, 1, n, 0)
                e.record()
                e.synchronize()
                times.append(cp.cuda.get_elapsed_time(s, e))
            ms = float(np.median(times[2:]))
        return n / (ms / 1e3) / 1e9

    for round_ in range(3):  # interleaved: plain, ours, plain, ours...
        res.setdefault("cudaMalloc_GBps", []).append(timed(plain[0], plain[1]))
        res.setdefault("device_pool_GBps", []).append(timed(ours[0], ours[1]))
    out = {k: float(np.median(v)) for k, v in res.items()}
    out["ratio"] = out["device_pool_GBps"] / out["cudaMalloc_GBps"]
    print("PEER_COPY " + json.dumps(out))
    for d, p in enumerate(ours):
        L.ump_cupy_free(None, p, d)
    print("PASS")


def per_device_limits_and_trim():
    """UMP_ALLOC_LIMIT=1G bounds each device on its own: 700 MiB fit on each of the two, 600 MiB
    more on device 1 raises CuPy's OutOfMemoryError naming the limit while device 0 still has
    room; trim gives both devices' idle memory back; stats report each device apart."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    n = (700 << 20) // 8
    keep = {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            a = cp.full(n, -1.0)  # poisoned, then written by a kernel
            a.fill(d + 1.5)
            assert ump_alloc.identify(a).device == d
            keep[d] = a
    st = ump_alloc.stats()["devices"]
    assert st[0]["in_use"] >= 700 << 20 and st[1]["in_use"] >= 700 << 20, st
    with cp.cuda.Device(1):
        try:
            cp.empty(600 << 20, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError as e:
            assert "UMP_ALLOC_LIMIT" in str(e), e
        else:
            raise AssertionError("no OutOfMemoryError over the limit on device 1")
    with cp.cuda.Device(0):
        extra = cp.ones(200 << 20, dtype=cp.uint8)  # device 0 has its own room
        assert int(extra.sum()) == 200 << 20
    for d, a in keep.items():
        with cp.cuda.Device(d):
            assert float(a.sum()) == (d + 1.5) * n
    del keep, extra, a
    cp.get_default_memory_pool().free_all_blocks()
    ump_alloc.trim()
    st = ump_alloc.stats()["devices"]
    assert st[0]["mapped"] < 64 << 20 and st[1]["mapped"] < 64 << 20, st
    print("PASS")


def managed_on_device_1():
    """Managed memory (the default device side) made on device 1: identify names device 1,
    device_access prefetches it to device 1 and host_access back, values intact, and freed
    blocks are reused on device 1 (discard on free)."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    rng = np.random.default_rng(12)
    h = rng.standard_normal(8 << 20)
    with cp.cuda.Device(1):
        a = cp.full(h.size, -1.0)
        a[...] = cp.asarray(h) * 3
        ident = ump_alloc.identify(a)
        assert ident.ours and ident.device == 1 and ident.kind == "managed", ident
        ump_alloc.device_access(a, device=1)
        ump_alloc.host_access(a)
        v = ump_alloc.asnumpy(a, copy=False)
        np.testing.assert_array_equal(v, h * 3)
        del a, v
        cp.get_default_memory_pool().free_all_blocks()
        b = cp.full(h.size, 4.0)
        assert ump_alloc.identify(b).device == 1 and float(b.sum()) == 4.0 * h.size
    print("PASS")


def torch_segments_on_device_1():
    """PyTorch's segments on cuda:1, from the main thread and from a thread that calls
    torch.cuda.set_device(1): every tensor is ours and on device 1; values right."""
    import threading

    import torch

    import ump_alloc

    torch.manual_seed(3)
    x = torch.randn(3 << 20, device="cuda:1")
    assert ump_alloc.identify(x).ours and ump_alloc.identify(x).device == 1, ump_alloc.identify(x)
    got = {}

    def worker():
        torch.cuda.set_device(1)
        t = torch.full((2 << 20,), 2.5, device="cuda")
        got["ident"] = ump_alloc.identify(t)
        got["sum"] = float(t.double().sum())

    th = threading.Thread(target=worker)
    th.start()
    th.join()
    assert got["ident"].ours and got["ident"].device == 1, got
    assert got["sum"] == 2.5 * (2 << 20), got
    assert abs(float(x.double().sum()) - float(x.cpu().double().sum())) < 1e-3
    print("PASS")


def cupy_device_1():
    """CuPy's Device(1): arrays are ump-alloc's on device 1, computed right."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    h = np.random.default_rng(5).standard_normal(1 << 22)
    with cp.cuda.Device(1):
        a = cp.full(h.size, -1.0)
        a[...] = cp.asarray(h) * 2 - 1
        ident = ump_alloc.identify(a)
        assert ident.ours and ident.device == 1, ident
        np.testing.assert_array_equal(cp.asnumpy(a), h * 2 - 1)
    print("PASS")


def _ipc_child(q_in, q_out):
    import torch

    t = q_in.get()
    torch.cuda.set_device(1)
    moved = t.to("cuda:1")  # the child works on the other GPU
    q_out.put((t.device.index, float(moved.double().sum())))


def ipc_to_the_other_gpu():
    """A CUDA tensor on cuda:0 (PyTorch's segments: plain device memory at the defaults) sent
    to a spawn child that works on cuda:1: the child opens it and reads the right values."""
    import torch
    import torch.multiprocessing as mp

    import ump_alloc

    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    torch.manual_seed(8)
    t = torch.randn(3 << 20, device="cuda:0") + 1
    assert ump_alloc.identify(t).ours and ump_alloc.identify(t).kind == "device"
    want = float(t.double().sum())
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    dev, got = q_out.get(timeout=180)
    p.join(60)
    assert dev == 0 and abs(got - want) <= 1e-6 * abs(want) + 1e-3, (dev, got, want)
    print("PASS")


def fork_child_of_a_two_gpu_parent():
    """A parent that used both GPUs forks: the child reads and writes its NumPy arrays (its
    writes stay its own), and CuPy there fails cleanly instead of crashing."""
    import cupy as cp

    import ump_alloc

    ump_alloc.enable(torch=False)
    h = np.random.default_rng(9).standard_normal(4 << 20)
    for d in (0, 1):
        with cp.cuda.Device(d):
            g = cp.asarray(h) + d
            assert float(g.sum()) != 0
    want = float(h.sum())
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = float(h.sum()) == want
        h[:10] = 0
        try:
            cp.zeros(10)
            cuda_refused = False
        except Exception:  # noqa: BLE001
            cuda_refused = True
        os.write(w, b"1" if ok and cuda_refused else b"0")
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
    assert h[0] != 0, "the child's write reached the parent"
    print("PASS")


def _train(model, data, target, steps, torch):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(data), target)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    return losses


def data_parallel():
    """torch.nn.DataParallel over both GPUs: the losses of 20 steps, printed for the runner to
    compare with plain PyTorch (same seeds); under UMP_ALLOC=1 the replicas' tensors on cuda:1
    are ours."""
    import torch

    torch.manual_seed(21)
    torch.backends.cudnn.deterministic = True
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 16)).cuda()
    dp = torch.nn.DataParallel(model, device_ids=[0, 1])
    g = torch.Generator().manual_seed(22)
    data = torch.randn(1024, 256, generator=g).cuda()
    target = torch.randn(1024, 16, generator=g).cuda()
    losses = _train(dp, data, target, 20, torch)
    if os.environ.get("UMP_ALLOC") == "1":
        import ump_alloc

        probe = torch.empty(1 << 20, device="cuda:1")
        assert ump_alloc.identify(probe).ours and ump_alloc.identify(probe).device == 1
    print("LOSSES " + json.dumps(losses))
    print("PASS")


DDP_WORKER = r"""
import json, os, sys, time
import torch, torch.distributed as dist

rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
torch.manual_seed(1234)
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096),
                            torch.nn.ReLU(), torch.nn.Linear(4096, 64)).cuda()
ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
g = torch.Generator().manual_seed(99 + rank)
data = torch.randn(256, 1024, generator=g).cuda(); target = torch.randn(256, 64, generator=g).cuda()
def step():
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(ddp(data), target)
    loss.backward(); opt.step()
    return loss
warm, timed = int(os.environ.get("DDP_WARM", "30")), int(os.environ.get("DDP_STEPS", "100"))
for _ in range(warm):
    step()
torch.cuda.synchronize(); dist.barrier()
t0 = time.perf_counter()
for _ in range(timed):
    loss = step()
torch.cuda.synchronize()
ms = (time.perf_counter() - t0) * 1e3 / timed
ours = None
if os.environ.get("UMP_ALLOC") == "1":
    import ump_alloc
    ours = ump_alloc.identify(next(model.parameters())).ours
out = {"rank": rank, "loss": float(loss), "step_ms": ms, "params_ours": ours,
       "param_kind": __import__("ump_alloc").identify(next(model.parameters())).kind if ours else None}
print("DDP " + json.dumps(out), flush=True)
dist.destroy_process_group()
"""


def run_ddp(env_extra, port):
    """Run two DDP ranks with `env_extra`; returns their result dicts."""
    procs = []
    for rank in (0, 1):
        env = dict(os.environ)
        env.update(env_extra, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", DDP_WORKER], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        o, e = p.communicate(timeout=300)
        assert p.returncode == 0, e[-3000:]
        out.append(json.loads(next(l for l in o.splitlines() if l.startswith("DDP "))[4:]))
    return out


def ddp_two_ranks():
    """DDP over NCCL, 2 ranks, plain and under UMP_ALLOC=1 (rounds interleaved, each its own
    processes): same final loss, parameters on ump-alloc's memory, and the step times side by
    side (printed for docs/BENCHMARKS.md)."""
    rounds = int(os.environ.get("DDP_ROUNDS", "2"))
    res = {"plain": [], "ump": []}
    port = 29500 + os.getpid() % 1000
    configs = (("plain", {"UMP_ALLOC": "0"}), ("ump", {"UMP_ALLOC": "1"}))
    for r in range(rounds):  # interleaved, in turn forward and backward: drift hits both alike
        for name, env in configs if r % 2 == 0 else configs[::-1]:
            port += 1
            res[name].append(run_ddp(env, port))
    for rp, ru in zip(res["plain"], res["ump"]):
        for a, b in zip(rp, ru):
            assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(a["loss"]) + 1e-6, (a, b)
            assert b["params_ours"] is True, b
    step = {k: float(np.median([x["step_ms"] for run in v for x in run])) for k, v in res.items()}
    step["ratio"] = step["ump"] / step["plain"]
    step["param_kind"] = res["ump"][0][0]["param_kind"]
    step["all"] = {k: [[round(x["step_ms"], 4) for x in run] for run in v] for k, v in res.items()}
    print("DDP_STEP " + json.dumps(step))
    print("PASS")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
