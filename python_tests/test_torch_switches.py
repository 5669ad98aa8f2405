"""The PyTorch transfer switches on the CPU: strict 0/1 values, shown by ``python -m ump_alloc
info``, and the layout rule the fast ``.cpu()`` uses (no PyTorch needed)."""

import pytest

from conftest import run_python
from ump_alloc import _torch_async as ta
from ump_alloc import _torch_transfer as tt

SWITCHES = ("UMP_ALLOC_TORCH_FAST_CPU", "UMP_ALLOC_TORCH_UNIFIED")


@pytest.mark.parametrize("var", SWITCHES)
@pytest.mark.parametrize("bad", ["yes", "2", "true", "01"])
def test_switch_values_are_strict(var, bad):
    r = run_python("import ump_alloc; ump_alloc.enable()", env={var: bad}, check=False)
    assert r.returncode != 0, r.stdout
    assert var in r.stderr, r.stderr


@pytest.mark.parametrize("var", SWITCHES)
@pytest.mark.parametrize("good", ["0", "1"])
def test_switch_values_accepted_and_shown(var, good):
    r = run_python("import ump_alloc.__main__ as m; m.main(['info'])", env={var: good})
    (line,) = [x for x in r.stdout.splitlines() if x.strip().startswith(var + " ")]
    assert good in line.replace(var, ""), line


@pytest.mark.parametrize(
    "shape, stride, dense",
    [
        ((4, 5), (5, 1), True),  # contiguous
        ((4, 5), (1, 4), True),  # transposed
        ((8, 3, 4, 4), (48, 1, 12, 3), True),  # channels-last
        ((4, 1, 5), (5, 7, 1), True),  # a size-1 dimension's stride does not matter
        ((), (), True),
        ((4, 5), (10, 1), False),  # a gap between rows
        ((4, 5), (2, 1), False),  # overlapping rows
        ((4, 5), (5, 2), False),  # every other element
        ((3, 4), (0, 1), False),  # broadcast
    ],
)
def test_dense_layouts(shape, stride, dense):
    assert tt._dense(shape, stride) is dense


def test_pytorch_allocator_settings_leave_pytorch_its_memory():
    """With PyTorch's own allocator settings (expandable_segments, cudaMallocAsync) the segments
    route cannot serve PyTorch: ump-alloc leaves PyTorch's memory to PyTorch (route "native",
    so a MemPool and the settings keep working) instead of swapping its allocator, and says once
    that NumPy alone is on ump-alloc (issue 37, item 9). No PyTorch needed: the fall-back alone."""
    import types
    import warnings

    from ump_alloc import _torch

    saved = dict(_torch._state)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            _torch._fall_back(types.SimpleNamespace(__version__="2.11.0"), "PYTORCH_CUDA_ALLOC_CONF has "
                              "expandable_segments:True")
        assert _torch._state["route"] == "native", _torch._state
        (w,) = [str(x.message) for x in seen]
        assert "leaves PyTorch 2.11.0's CUDA memory to PyTorch" in w and "NumPy" in w, w
        assert "UMP_ALLOC_TORCH_ROUTE=swap" in w, w
    finally:
        _torch._state.clear()
        _torch._state.update(saved)


def test_a_refused_switch_leaves_pytorch_as_it_was():
    """A transfer switch the table refuses (here set after the library started, which checked
    the environment then) raises before anything of PyTorch's is hooked or swapped: the
    program's PyTorch stays on its own allocator. Control: a valid value goes on to hook."""
    code = (
        "import json, os, sys, types\n"
        "import ump_alloc\n"
        "from ump_alloc import _config, _torch\n"
        "_config.init()\n"
        "sys.modules['torch'] = types.SimpleNamespace(__version__='0')\n"
        "calls = []\n"
        "_torch._segments_unavailable = lambda torch: calls.append('probe') or 'stand-in'\n"
        "_torch._fall_back = lambda torch, why: calls.append('fall back')\n"
        "_torch._patch_ipc = lambda torch: None\n"
        "import ump_alloc._torch_transfer as tt\n"
        "tt.install = lambda torch, **kw: calls.append(('transfer', kw))\n"
        "out = {}\n"
        "os.environ['UMP_ALLOC_TORCH_FAST_CPU'] = os.environ['LATER']\n"
        "try:\n"
        "    _torch.install(route='segments')\n"
        "except ump_alloc.UmpError as e:\n"
        "    out['error'] = str(e)\n"
        "out['calls'] = calls\n"
        "out['installed'] = _torch._state['installed']\n"
        "print(json.dumps(out))\n"
    )
    import json

    bad = json.loads(run_python(code, env={"LATER": "yes"}).stdout.strip().splitlines()[-1])
    assert 'UMP_ALLOC_TORCH_FAST_CPU="yes"' in bad.get("error", ""), bad
    assert bad["calls"] == [] and bad["installed"] is False, bad
    good = json.loads(run_python(code, env={"LATER": "0"}).stdout.strip().splitlines()[-1])
    assert "error" not in good and good["calls"][0] == "probe", good
    assert good["calls"][-1] == ["transfer", {"fast_cpu": False, "unified": False}], good


@pytest.mark.parametrize(
    "args, kwargs, want",
    [
        (("cuda",), {}, False),
        (("cuda",), {"non_blocking": True}, True),
        (("cuda",), {"non_blocking": False}, False),
        (("cuda", None, True), {}, True),  # to(device, dtype, non_blocking)
        ((None, True), {}, True),  # to(dtype, non_blocking) / cuda(device, non_blocking)
        ((1,), {}, False),  # a device index is not a flag
        (("cuda", None, __import__("numpy").True_), {}, True),  # NumPy's True, as PyTorch takes it
        (("cuda", None, __import__("numpy").False_), {}, False),
        ((), {}, False),
    ],
)
def test_non_blocking_flag_is_found_without_parsing(args, kwargs, want):
    assert ta.non_blocking(args, kwargs) is want


class _Event:
    def __init__(self, done):
        self.done = done
        self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = True


@pytest.fixture
def fresh_async(monkeypatch):
    """The guard's state, empty, for one test."""
    import threading

    monkeypatch.setattr(ta, "_by_stream", {})
    monkeypatch.setattr(ta, "_lock", threading.RLock())
    monkeypatch.setattr(ta, "_held", [0])
    monkeypatch.setattr(ta, "_held_bytes", [0])
    return ta


def test_sources_are_let_go_stream_by_stream(fresh_async):
    """A stream's copies complete in order: letting go stops at its first copy not done, and
    other streams do not wait for it. Past the cap the oldest copies are waited for (outside
    the lock). A lost context (queries raising) keeps what it holds and raises nothing."""
    a1, a2, b1 = _Event(True), _Event(False), _Event(True)
    a3 = _Event(True)  # done, but behind a2 on stream a: kept until a2 is
    ta.hold("a", a1, "A1", 100)
    ta.hold("a", a2, "A2", 100)
    ta.hold("a", a3, "A3", 100)
    ta.hold("b", b1, "B1", 100)
    ta.drop_copied()
    assert ta.held() == 2 and ta._held_bytes[0] == 200 and [e[1] for e in ta._by_stream["a"]] == ["A2", "A3"]
    assert "b" not in ta._by_stream
    ta.hold("c", _Event(False), "C1", 100)
    ta.drop_copied(wait_over=100)  # waits for the oldest: A2, then A3
    assert a2.waited and a3.waited and ta.held() == 1 and ta._held_bytes[0] == 100

    class Lost:
        def query(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    ta.hold("d", Lost(), "D1", 100)
    ta.drop_copied()  # raises nothing
    assert ta.held() == 2 and [e[1] for e in ta._by_stream["d"]] == ["D1"], "kept while nothing is known"


def test_fork_child_keeps_what_was_in_flight_untouched(fresh_async):
    """A fork child cannot query (or destroy) the parent's CUDA events: it starts with nothing
    held and keeps the inherited entries, never asking them anything."""
    import os

    class Untouchable:
        def query(self):
            os._exit(3)  # asked in the child: the test fails

    ta.hold("a", Untouchable(), "A1", 1)
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            ok = ta.held() == 0 and not ta._by_stream and ta._inherited
            ta.drop_copied()
            code = 0 if ok else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _stand_in_torch(capturing=False):
    """Just enough of PyTorch for ``keep_until_copied``: tensors over an address, events that
    remember their stream, streams that count their synchronisations, a capture flag."""
    import types

    strided, sparse = object(), object()
    synced = []

    class Tensor:
        def __init__(self, ptr, cuda, layout=strided):
            self.ptr, self.is_cuda, self.device = ptr, cuda, "cuda:0" if cuda else "cpu"
            self.layout, self.nbytes = layout, 4096

        def numel(self):
            return 1

        def untyped_storage(self):
            if self.layout is not strided:
                raise NotImplementedError("no storage")
            return types.SimpleNamespace(data_ptr=lambda: self.ptr, of=self)

    class Event:
        fail = False

        def record(self, stream):
            if Event.fail:
                raise RuntimeError("CUDA error")
            self.stream = stream

        def query(self):
            return False

    class Stream:
        device_index, cuda_stream = 0, 1234

        def synchronize(self):
            synced.append(self)

    stream = Stream()
    cuda = types.SimpleNamespace(
        Event=Event,
        current_stream=lambda device: stream,
        is_current_stream_capturing=lambda: capturing,
    )
    return types.SimpleNamespace(Tensor=Tensor, cuda=cuda, strided=strided, sparse=sparse, synced=synced,
                                 stream=stream)


def test_only_sources_on_blocks_of_ours_are_held(fresh_async):
    """The guard holds the storage of a CPU source that starts at a block of ump-alloc's (the
    storage: Module.to swaps a Parameter's data away), with an event on the destination's
    current stream; foreign memory, a view into a block, a copy to the CPU, a sparse source and
    a copy made during a CUDA graph capture hold nothing; a failed hold synchronises."""
    import ctypes

    import numpy as np

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    try:
        block = np.ones(1 << 16)
        assert ump_alloc.handles(block)
        foreign = ctypes.create_string_buffer(1 << 16)
        torch = _stand_in_torch()
        dst = torch.Tensor(0, cuda=True)
        for src in (torch.Tensor(ctypes.addressof(foreign), cuda=False),
                    torch.Tensor(block.ctypes.data + 8, cuda=False)):
            ta.keep_until_copied(src, dst, torch)
        assert ta.held() == 0
        ta.keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False), torch.Tensor(0, cuda=False), torch)
        assert ta.held() == 0, "a copy to the CPU holds nothing"
        capturing = _stand_in_torch(capturing=True)
        ta.keep_until_copied(capturing.Tensor(block.ctypes.data, cuda=False), capturing.Tensor(0, cuda=True), capturing)
        assert ta.held() == 0, "nothing recorded during a capture"
        src = torch.Tensor(block.ctypes.data, cuda=False)
        ta.keep_until_copied(src, dst, torch)
        assert ta.held() == 1
        ((key, q),) = ta._by_stream.items()
        ev, storage, nbytes, _ = q[0]
        assert key == (0, 1234) and storage.of is src and ev.stream is torch.stream and nbytes == src.nbytes
        ta.keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False, layout=torch.sparse), dst, torch)
        assert ta.held() == 1 and not torch.synced, "a sparse source: nothing to hold, no error"
        type(ev).fail = True  # recording fails: the stream is synchronised instead, no error
        ta.keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False), dst, torch)
        assert ta.held() == 1 and torch.synced == [torch.stream]
    finally:
        ump_alloc.disable()


def test_patched_calls_route_cpu_tensors_and_parameters_asking_non_blocking(fresh_async):
    """``_guard_call``, what the patched ``.to``/``.cuda`` ask first: a CPU tensor or Parameter
    (a subclass of it too) asking for ``non_blocking`` is copied through the guard; a CUDA
    tensor, another subclass, a blocking call and anything while compiling are left to the
    caller (None)."""
    import types

    torch = _stand_in_torch()

    class Parameter(torch.Tensor):
        pass

    class Buffered(Parameter):
        pass

    class Other(torch.Tensor):
        pass

    compiling = [False]
    torch.nn = types.SimpleNamespace(Parameter=Parameter)
    torch.jit = types.SimpleNamespace(is_tracing=lambda: False, is_scripting=lambda: False)
    torch.compiler = types.SimpleNamespace(is_compiling=lambda: compiling[0])
    calls = []

    def fn(src, *args, **kwargs):
        calls.append((src, args, kwargs))
        return torch.Tensor(0, cuda=True)

    for cls in (torch.Tensor, Parameter, Buffered):
        src = cls(0, cuda=False)
        got = tt._guard_call(fn, src, ("cuda",), {"non_blocking": True}, torch)
        assert got is not None and calls[-1] == (src, ("cuda",), {"non_blocking": True}), cls
    n = len(calls)
    left = [
        (torch.Tensor(0, cuda=True), ("cuda",), {"non_blocking": True}),
        (Other(0, cuda=False), ("cuda",), {"non_blocking": True}),
        (torch.Tensor(0, cuda=False), ("cuda",), {}),
    ]
    for src, args, kwargs in left:
        assert tt._guard_call(fn, src, args, kwargs, torch) is None
    compiling[0] = True
    assert tt._guard_call(fn, torch.Tensor(0, cuda=False), ("cuda",), {"non_blocking": True}, torch) is None
    assert len(calls) == n, "left calls are the caller's to make"
