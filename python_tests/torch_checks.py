"""PyTorch checks on the GPU, each run in a fresh interpreter by test_torch_routes.py:
``python -c "import torch_checks as t; t.NAME()"`` with UMP_ALLOC / UMP_ALLOC_TORCH_ROUTE / a mode
in the environment. Random data, poisoned outputs, and a control wherever a check guards
against a violation. Each prints ``PASS`` (the runner checks it) or raises."""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gpu_checks import _record_stream_trials  # noqa: E402  (the issue-11 scenario, shared)


def _route():
    """The route the process runs on: plain (no ump-alloc), segments or swap."""
    if os.environ.get("UMP_ALLOC", "0") != "1":
        return "plain"
    from ump_alloc import _torch

    return _torch.route()


def _ours(t) -> bool:
    import ump_alloc

    return ump_alloc.identify(t.data_ptr()).ours


# ---- the compatibility matrix ------------------------------------------------------------------
#
# Each item does an everyday thing and returns a value that is checked against what it must be
# (a result, not only the absence of an exception). ITEMS maps its name to (function, whether
# the swap route is documented to lack it: ump_alloc._torch.SWAP_UNSUPPORTED).


def _i_memory_allocated(torch):
    before = torch.cuda.memory_allocated()
    x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
    grew = torch.cuda.memory_allocated() - before
    del x
    assert grew >= 3 << 20, grew
    return grew


def _i_max_memory_allocated(torch):
    x = torch.empty(5 << 20, dtype=torch.uint8, device="cuda")
    peak = torch.cuda.max_memory_allocated()
    assert peak >= torch.cuda.memory_allocated() >= 5 << 20
    del x
    return peak


def _i_memory_reserved(torch):
    x = torch.empty(7 << 20, dtype=torch.uint8, device="cuda")
    r = torch.cuda.memory_reserved()
    assert r >= torch.cuda.memory_allocated() >= 7 << 20
    del x
    return r


def _i_memory_stats(torch):
    x = torch.empty(1 << 20, device="cuda")
    st = torch.cuda.memory_stats()
    assert st["allocation.all.current"] >= 1 and st["segment.all.current"] >= 1, st
    del x
    return st["allocation.all.current"]


def _i_memory_summary(torch):
    s = torch.cuda.memory_summary()
    assert "PyTorch CUDA memory summary" in s, s[:200]
    return len(s)


def _i_reset_peak_memory_stats(torch):
    x = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
    del x
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    return True


def _i_snapshot(torch):
    torch.cuda.memory._record_memory_history(max_entries=1000)
    x = torch.empty(11 << 20, dtype=torch.uint8, device="cuda")
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocs = [e for t in snap["device_traces"] for e in t if e["action"] == "alloc" and e["size"] >= 11 << 20]
    assert snap["segments"] and allocs, "the snapshot shows the allocation"
    del x
    return len(snap["segments"])


def _i_memory_snapshot(torch):
    x = torch.empty(1 << 20, device="cuda")
    segs = torch.cuda.memory_snapshot()
    assert any(b["state"] == "active_allocated" for s in segs for b in s["blocks"]), segs[:1]
    del x
    return len(segs)


def _i_cudnn_benchmark(torch):
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda()
    x = torch.randn(16, 64, 56, 56, device="cuda")
    with torch.backends.cudnn.flags(enabled=False):
        want = conv(x)  # the reference without cuDNN: its plan cache stays empty for this shape
    torch.backends.cudnn.benchmark = True  # the first cuDNN call benchmarks (and asks cacheInfo)
    try:
        got = conv(x)
    finally:
        torch.backends.cudnn.benchmark = False
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    return float(got.abs().sum())


def _i_compile_reduce_overhead(torch):
    torch.manual_seed(4)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda()
    cm = torch.compile(m, mode="reduce-overhead")
    # Changing batch sizes make the shapes symbolic: Dynamo then runs FakeTensors with
    # symbolic sizes through every patched Tensor method.
    for batch in (32, 32, 48, 16, 32):
        inp = torch.randn(batch, 64, device="cuda")
        out = cm(inp)
        torch.testing.assert_close(out, m(inp), rtol=1e-3, atol=1e-3)
    return True


def _i_compile_default(torch):
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU()).cuda()
    cm = torch.compile(m)
    inp = torch.randn(16, 32, device="cuda")
    torch.testing.assert_close(cm(inp), m(inp), rtol=1e-3, atol=1e-3)
    return True


def _i_user_mempool(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        z = torch.full((1 << 20,), 3.0, device="cuda")
    assert float(z.sum()) == 3.0 * (1 << 20)
    assert pool.snapshot(), "the pool holds the tensor's segment"
    del z
    return True


def _i_autocast_gradscaler(torch):
    torch.manual_seed(6)
    m = torch.nn.Linear(128, 10).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    x = torch.randn(256, 128, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(m(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    return losses[-1]


def _i_checkpointing(torch):
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(7)
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64)).cuda()
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    m(x).sum().backward()
    want = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    checkpoint(m, x, use_reentrant=False).sum().backward()
    for p, w in zip(m.parameters(), want):
        torch.testing.assert_close(p.grad, w)
    return True


def _i_cuda_graph(torch):
    torch.manual_seed(8)
    static_in = torch.randn(1 << 20, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            _ = static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        tmp = static_in * 2
        big = torch.empty(16 << 20, device="cuda")
        big.fill_(1)
        static_out = tmp + big[: 1 << 20]
    del tmp, big
    # Tensors made after the capture must not alias the graph's memory.
    others = [torch.full((4 << 20,), 7.0, device="cuda") for _ in range(6)]
    static_in.copy_(torch.randn(1 << 20, device="cuda"))
    static_out.fill_(float("nan"))  # poison: replay must rewrite it
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, static_in * 2 + 1)
    assert all(bool((o == 7.0).all()) for o in others), "a tensor made after capture was overwritten"
    return True


def _i_caching_allocator_alloc(torch):
    p = torch.cuda.caching_allocator_alloc(4 << 20)
    assert p and p % 512 == 0, p
    t = torch.empty(0, device="cuda")  # the allocator works on around the raw block
    torch.cuda.caching_allocator_delete(p)
    q = torch.cuda.caching_allocator_alloc(4 << 20)
    torch.cuda.caching_allocator_delete(q)
    del t
    return True


def _i_save_load(torch):
    import io

    torch.manual_seed(9)
    t = torch.randn(1000, 17, device="cuda")
    buf = io.BytesIO()
    torch.save({"w": t}, buf)
    buf.seek(0)
    back = torch.load(buf)["w"]
    assert back.is_cuda and torch.equal(back, t)
    return True


def _i_pin_memory(torch):
    host = torch.randn(1 << 20).pin_memory()
    assert host.is_pinned()
    dev = host.to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), host)
    return True


def _i_empty_cache(torch):
    # The driver's free memory (every route reports it; PyTorch's own statistics are absent on
    # the swap route).
    x = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    del x
    before = torch.cuda.mem_get_info()[0]
    torch.cuda.empty_cache()
    after = torch.cuda.mem_get_info()[0]
    assert after >= before + (512 << 20), f"empty_cache freed {(after - before) >> 20} MiB"
    return after - before


def _i_memory_fraction(torch):
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.02, 0)
    try:
        try:
            torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
        except torch.OutOfMemoryError:
            pass
        else:
            raise AssertionError("no OutOfMemoryError past the memory fraction")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
    y = torch.empty(int(total * 0.05), dtype=torch.uint8, device="cuda")
    y.fill_(2)
    ok = int(y[-4:].sum()) == 8
    del y
    torch.cuda.empty_cache()
    assert ok
    return True


def _i_out_of_memory(torch):
    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("a 1 PiB tensor did not raise torch.OutOfMemoryError")
    x = torch.ones(1000, device="cuda")
    assert float(x.sum()) == 1000.0
    return True


def _i_record_stream(torch):
    s = torch.cuda.Stream()
    x = torch.randn(1 << 20, device="cuda")
    with torch.cuda.stream(s):
        y = x * 2
    x.record_stream(s)
    s.synchronize()
    total = float(y.sum())
    del x, y
    return total


def _i_mem_get_info(torch):
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    return total


def _i_thread_tensor(torch):
    box = {}

    def work():
        box["t"] = torch.full((4 << 20,), 2.0, device="cuda")

    th = threading.Thread(target=work)
    th.start()
    th.join()
    assert float(box["t"].sum()) == 2.0 * (4 << 20)
    return True


def _i_two_streams(torch):
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    torch.manual_seed(10)
    a = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s1):
        b = a * 3
    with torch.cuda.stream(s2):
        c = a + 1
    torch.cuda.synchronize()
    torch.testing.assert_close(b, a * 3)
    torch.testing.assert_close(c, a + 1)
    return True


ITEMS = {
    # name: (function, the swap route lacks it)
    "memory_allocated": (_i_memory_allocated, True),
    "max_memory_allocated": (_i_max_memory_allocated, True),
    "memory_reserved": (_i_memory_reserved, True),
    "memory_stats": (_i_memory_stats, True),
    "memory_summary": (_i_memory_summary, True),
    "reset_peak_memory_stats": (_i_reset_peak_memory_stats, True),
    "record_memory_history_snapshot": (_i_snapshot, True),
    "memory_snapshot": (_i_memory_snapshot, True),
    "cudnn_benchmark": (_i_cudnn_benchmark, True),
    "user_mempool": (_i_user_mempool, True),
    "autocast_gradscaler": (_i_autocast_gradscaler, False),
    "activation_checkpointing": (_i_checkpointing, False),
    "caching_allocator_alloc_delete": (_i_caching_allocator_alloc, False),
    "save_load_cuda": (_i_save_load, False),
    "pin_memory": (_i_pin_memory, False),
    "empty_cache": (_i_empty_cache, False),
    "set_per_process_memory_fraction": (_i_memory_fraction, False),
    "out_of_memory_error": (_i_out_of_memory, False),
    "record_stream": (_i_record_stream, False),
    "mem_get_info": (_i_mem_get_info, False),
    "thread_tensor": (_i_thread_tensor, False),
    "two_streams": (_i_two_streams, False),
    "compile_default": (_i_compile_default, False),
    "compile_reduce_overhead": (_i_compile_reduce_overhead, True),
    # Last: on the swap route a failed capture leaves PyTorch's RNG state behind it unusable.
    "cuda_graph_capture_replay": (_i_cuda_graph, True),
}


def compat_matrix():
    """Run every item in this process; print one JSON line of {item: "ok" | "FAIL ..."}."""
    import torch

    import ump_alloc  # noqa: F401  (UMP_ALLOC=1 switched PyTorch over at `import torch`)

    torch.ones(1, device="cuda")
    out = {"route": _route()}
    for name, (fn, _) in ITEMS.items():
        try:
            fn(torch)
            out[name] = "ok"
        except Exception as e:  # noqa: BLE001 - the matrix records what raised
            out[name] = f"FAIL {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
            import traceback

            print(f"--- {name}:", file=sys.stderr)
            traceback.print_exc(limit=-8)
        torch.cuda.synchronize()
    if out["route"] != "plain":
        x = torch.empty(9 << 20, dtype=torch.uint8, device="cuda")
        out["tensor_is_ours"] = _ours(x)
    print("MATRIX " + json.dumps(out))
    print("PASS")


# ---- the segments route ------------------------------------------------------------------------


def segments_identity_and_stats():
    """Tensors live inside ump-alloc blocks (PyTorch's segments); torch.cuda.memory_reserved()
    equals what ump-alloc has handed out on the device, and both see a new segment."""
    import torch

    import ump_alloc

    assert _route() == "segments", _route()
    torch.manual_seed(1)
    ts = [torch.randn(n, device="cuda") for n in (10, 1 << 16, 3 << 20, 40 << 20)]
    want = os.environ.get("EXPECT_KIND")
    for t in ts:
        ident = ump_alloc.identify(t)
        assert ident.ours and ident.device == 0 and ident.kind in ("managed", "device"), ident
        assert want is None or ident.kind == want, (ident, want)
        assert ident.base <= t.data_ptr() and t.data_ptr() + t.nbytes <= ident.base + ident.size, ident
    torch.cuda.synchronize()
    d = ump_alloc.stats()["devices"][0]
    assert d["in_use"] == torch.cuda.memory_reserved(), (d["in_use"], torch.cuda.memory_reserved())
    before = torch.cuda.memory_reserved()
    big = torch.empty(300 << 20, dtype=torch.uint8, device="cuda")
    grown = torch.cuda.memory_reserved() - before
    assert grown >= 300 << 20 and ump_alloc.stats()["devices"][0]["in_use"] - d["in_use"] == grown
    # The host reads a tensor through a zero-copy view of its segment (managed memory).
    if ump_alloc.identify(ts[2]).kind == "managed":
        h = ump_alloc.asnumpy(ts[2])
        assert np.array_equal(h, ts[2].cpu().numpy())
    del big
    torch.cuda.empty_cache()
    assert ump_alloc.stats()["devices"][0]["in_use"] == torch.cuda.memory_reserved()
    print("PASS")


def segments_empty_cache():
    """torch.cuda.empty_cache() releases PyTorch's segments and ump-alloc gives them back to the
    driver: mapped memory falls by the freed GiB."""
    import torch

    import ump_alloc

    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(7)
    torch.cuda.synchronize()
    del x
    mapped = ump_alloc.stats()["devices"][0]["mapped"]
    reserved = torch.cuda.memory_reserved()
    assert reserved >= 1 << 30 and mapped >= 1 << 30, (reserved, mapped)
    torch.cuda.empty_cache()
    assert torch.cuda.memory_reserved() <= reserved - (1 << 30)
    after = ump_alloc.stats()["devices"][0]["mapped"]
    assert after <= mapped - (1 << 30), f"mapped {mapped >> 20} -> {after >> 20} MiB"
    print("PASS")


def segments_out_of_memory():
    """Under UMP_ALLOC_LIMIT=1G: PyTorch's own out-of-memory retry works (a tensor that fits once
    PyTorch's cache is released succeeds, num_alloc_retries counts it), a tensor past the limit
    raises torch.OutOfMemoryError, and PyTorch stays usable."""
    import torch

    import ump_alloc

    assert os.environ.get("UMP_ALLOC_LIMIT") == "1G"
    a = torch.empty(600 << 20, dtype=torch.uint8, device="cuda")
    a.fill_(1)
    del a  # cached by PyTorch: 600 MiB of the 1 GiB stay mapped
    b = torch.empty(700 << 20, dtype=torch.uint8, device="cuda")
    b.fill_(3)
    assert int(b[-8:].sum()) == 24
    retries = torch.cuda.memory_stats()["num_alloc_retries"]
    assert retries >= 1, "PyTorch released its cache and tried again"
    try:
        torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        print("OOM:", str(e).splitlines()[0][:120])
    else:
        raise AssertionError("no torch.OutOfMemoryError past UMP_ALLOC_LIMIT")
    assert "UMP_ALLOC_LIMIT" in (ump_alloc.last_error() or ""), ump_alloc.last_error()
    assert torch.cuda.memory_stats()["num_ooms"] >= 1
    del b
    x = torch.randn(1000, device="cuda")
    assert abs(float(x.sum()) - float(x.cpu().sum())) < 1e-2
    print("PASS")


def segments_late_enable_and_disable():
    """enable() after CUDA tensors exist: those stay PyTorch's (and are freed through CUDA), new
    segments are ump-alloc's; disable() gives new segments back to CUDA, and the ones PyTorch
    still holds from ump-alloc go back to it when released."""
    import torch

    import ump_alloc

    torch.manual_seed(2)
    old = torch.randn(8 << 20, device="cuda")
    old_sum = float(old.sum())
    assert not _ours(old)
    ump_alloc.enable(numpy=False, cupy=False, torch=True)
    from ump_alloc import _torch

    assert _torch.route() == "segments", _torch.route()
    new = torch.randn(8 << 20, device="cuda")
    assert _ours(new) and not _ours(old)
    assert abs(float(old.sum()) - old_sum) < 1e-3
    del old
    torch.cuda.empty_cache()  # the old segment goes through CUDA's cudaFree
    ump_alloc.disable()
    later = torch.randn(64 << 20, device="cuda")
    assert not _ours(later), "after disable() new segments are PyTorch's own"
    in_use = ump_alloc.stats()["devices"][0]["in_use"]
    del new
    torch.cuda.empty_cache()
    assert ump_alloc.stats()["devices"][0]["in_use"] < in_use, "the ump-alloc segment went back"
    ump_alloc.enable(numpy=False, cupy=False, torch=True)
    again = torch.randn(64 << 20, device="cuda")
    assert _ours(again), "enable() again hooks again"
    print("PASS")


def segments_record_stream():
    """record_stream on the segments route is PyTorch's own: a recorded block is not reused under
    the side stream. The control (no record_stream) shows the corruption, so the check can fail.
    Recorded blocks do come back (no pile-up: the memory stays flat over 200 iterations)."""
    import torch

    assert _route() == "segments", _route()
    wrong, reused = _record_stream_trials(record=False)
    print(f"control, no record_stream: {wrong}/10 wrong sums, {reused}/10 reused at once")
    assert reused > 0 and wrong > 0, "the control did not reproduce the race: the check cannot fail"
    wrong, reused = _record_stream_trials(record=True)
    print(f"record_stream: {wrong}/10 wrong sums, {reused}/10 reused at once")
    assert wrong == 0
    s = torch.cuda.Stream()
    r0 = torch.cuda.memory_reserved()
    for i in range(200):
        x = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
        with torch.cuda.stream(s):
            x.add_(1)
        x.record_stream(s)
        del x
        if i % 50 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    _ = torch.empty(8 << 20, dtype=torch.uint8, device="cuda")
    growth = torch.cuda.memory_reserved() - r0
    print(f"200 recorded 8 MiB blocks: reserved grew {growth >> 20} MiB")
    assert growth <= 64 << 20, "recorded blocks pile up"
    print("PASS")


def _ipc_child(q_in, q_out):
    t = q_in.get()
    q_out.put(float(t.double().sum()))
    q_out.put("done")


def ipc():
    """A CUDA tensor sent to a spawn child through torch.multiprocessing: the child reads it
    right where the memory can be exported (PyTorch's own, or ump-alloc's plain cuMemAlloc
    device memory); elsewhere the error names the setting that makes it work."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing as mp  # registers the CUDA tensor reductions

    os.environ["PYTHONPATH"] = HERE + os.pathsep + os.environ.get("PYTHONPATH", "")
    torch.manual_seed(12)
    t = torch.randn(3 << 20, device="cuda") + 1
    want = float(t.double().sum())
    expect_ok = os.environ.get("EXPECT_IPC") == "ok"
    try:
        ForkingPickler.dumps(t)  # what a torch.multiprocessing queue does in its feeder thread
    except RuntimeError as e:
        msg = str(e)
        print("IPC refused:", msg[:300])
        assert not expect_ok, msg
        assert "UMP_ALLOC_TORCH_SEGMENTS=device" in msg, msg
        print("PASS")
        return
    assert expect_ok, "sharing managed or virtual-memory-pool memory over CUDA IPC should not work"
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_ipc_child, args=(q_in, q_out))
    p.start()
    q_in.put(t)
    got = q_out.get(timeout=120)
    assert q_out.get(timeout=60) == "done"
    p.join(60)
    assert abs(got - want) <= 1e-6 * abs(want) + 1e-3, (got, want)
    print(f"child read {got} (want {want})")
    print("PASS")


def oversubscription_refused():
    """Managed memory beyond the GPU's free memory is refused before any driver call
    (UMP_ALLOC_OVERSUBSCRIBE=0, the default), as torch.OutOfMemoryError after PyTorch emptied its
    cache; the pool stays usable. A request past the address space (1 PiB) keeps the test safe
    even if the check were missing: the driver would refuse it at once."""
    import torch

    import ump_alloc

    try:
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        pass
    else:
        raise AssertionError("no OutOfMemoryError")
    err = ump_alloc.last_error() or ""
    if ump_alloc.identify(torch.ones(1, device="cuda")).kind == "managed":
        assert "UMP_ALLOC_OVERSUBSCRIBE=1" in err, err
    x = torch.randn(1 << 20, device="cuda")
    assert abs(float(x.sum()) - float(x.cpu().sum())) < 1e-1
    print("PASS")


def alloc_conf_left_to_pytorch():
    """With PyTorch's own allocator settings (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF set by
    the test: expandable_segments:True or backend:cudaMallocAsync), UMP_ALLOC=1 leaves PyTorch's
    CUDA memory to PyTorch: the backend is the one asked for, a user's MemPool works, tensors are
    PyTorch's (not ump-alloc's), and NumPy is on ump-alloc (issue 37, item 9)."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import torch

        import ump_alloc

        x = torch.randn(1 << 20, device="cuda")
    assert _route() == "native", _route()
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") + os.environ.get("PYTORCH_ALLOC_CONF", "")
    backend = torch.cuda.memory.get_allocator_backend()
    assert backend == ("cudaMallocAsync" if "cudaMallocAsync" in conf else "native"), backend
    assert not ump_alloc.identify(x).ours, ump_alloc.identify(x)
    if backend == "native":
        pool = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(pool):
            y = torch.full((1 << 20,), 3.0, device="cuda")
        assert float(y.sum()) == 3.0 * (1 << 20)
    a = np.ones(1 << 20)
    assert ump_alloc.handles(a), "NumPy stays on ump-alloc"
    assert any("leaves PyTorch" in str(w.message) for w in seen), [str(w.message) for w in seen]
    print("PASS")


def _nonblocking_trials(torch, x, ways, drop_guard):
    """Copy a NumPy temporary of ``x`` to the GPU with each of ``ways`` (non_blocking) behind a
    busy stream, drop it at once and write -1 into a new array of its size: (wrong copies,
    temporaries whose memory the new array got at once)."""
    from ump_alloc import _torch_async as ta

    wrong = reused = 0
    for way in ways * 3:
        torch.cuda._sleep(int(2e8))  # the copy waits behind this on the stream
        tmp = x.copy()
        p = tmp.ctypes.data
        g = way(torch.from_numpy(tmp))
        del tmp
        if drop_guard:  # the control: what happens without the guard
            with ta._lock:
                ta._by_stream.clear()
                ta._held[0] = ta._held_bytes[0] = 0
        y = np.full(x.size, -1.0)
        reused += y.ctypes.data == p
        torch.cuda.synchronize()
        wrong += not np.array_equal(g.cpu().numpy(), x)
        del y, g
    return wrong, reused


def nonblocking_h2d_keeps_its_source():
    """UMP_ALLOC=1: ``torch.from_numpy(tmp).cuda(non_blocking=True)`` (and ``.to`` in its forms)
    with the temporary dropped at once copies the data, not what NumPy writes next into the
    reused memory: the source is kept until the copy ran, then let go. Random data; the control
    (the guard's list emptied right after each copy) shows the corruption, so the check can
    fail."""
    import torch

    import ump_alloc
    from ump_alloc import _torch_async as ta

    torch.zeros(1, device="cuda")  # the first use of the GPU: NumPy's memory is pinned from here
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    x = rng.random(1 << 22)
    ident = ump_alloc.identify(x.copy())
    assert ident.ours and ident.device_accessible, ident
    ways = [
        lambda t: t.cuda(non_blocking=True),
        lambda t: t.to("cuda", non_blocking=True),
        lambda t: t.to(torch.device("cuda"), torch.float64, True),
        # Module.to(non_blocking=True) moves Parameters this way
        lambda t: torch.nn.Parameter(t, requires_grad=False).to("cuda", None, True),
    ]
    wrong, reused = _nonblocking_trials(torch, x, ways, drop_guard=True)
    print(f"control, guard dropped: {wrong}/12 wrong copies, {reused}/12 reused at once")
    assert wrong > 0 and reused > 0, "the control did not reproduce the race: the check cannot fail"
    wrong, reused = _nonblocking_trials(torch, x, ways, drop_guard=False)
    print(f"guarded: {wrong}/12 wrong copies, {reused}/12 reused at once, {ta.held()} held")
    assert wrong == 0 and reused == 0, (wrong, reused)
    torch.cuda.synchronize()
    torch.ones(4).to("cuda", non_blocking=True)  # PyTorch's memory: not held; lets go of the rest
    assert ta.held() == 0, ta.held()
    # A blocking copy and a copy from PyTorch's own memory keep nothing.
    torch.from_numpy(x.copy()).cuda()
    torch.from_numpy(x).clone().cuda(non_blocking=True)
    assert ta.held() == 0, ta.held()
    print("PASS")


if __name__ == "__main__":
    globals()[sys.argv[1]]()
