"""The PyTorch transfer switches on the CPU: strict 0/1 values, shown by ``python -m ump_alloc
info``, and the layout rule the fast ``.cpu()`` uses (no PyTorch needed)."""

import pytest

from conftest import run_python
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
    assert tt._non_blocking(args, kwargs) is want


class _Event:
    def __init__(self, done):
        self.done = done

    def query(self):
        return self.done


def test_sources_are_let_go_once_copied(monkeypatch):
    """Sources of non_blocking copies go once their own events complete (copies on other
    streams do not wait for each other); past the cap the oldest copies are waited for; a
    context lost (queries raising) keeps what is left and raises nothing."""
    import collections

    monkeypatch.setattr(tt, "_in_flight", collections.deque())
    monkeypatch.setattr(tt, "_held", [0])
    monkeypatch.setattr(tt, "_held_bytes", [0])
    first, second, third = _Event(True), _Event(False), _Event(True)
    for e in (first, second, third):
        tt._in_flight.append((e, object(), 100))
    tt._held[0], tt._held_bytes[0] = 3, 300
    tt._drop_copied()
    assert tt.in_flight() == 1 and tt._in_flight[0][0] is second and tt._held_bytes[0] == 100
    waited = []
    second.synchronize = lambda: waited.append(second)
    tt._in_flight.append((_Event(False), object(), 100))
    tt._held[0], tt._held_bytes[0] = 2, 200
    tt._drop_copied(wait_over=100)
    assert waited == [second] and tt.in_flight() == 1 and tt._held_bytes[0] == 100

    class Lost:
        def query(self):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    tt._in_flight.append((Lost(), object(), 100))
    tt._drop_copied()  # raises nothing


def test_fork_child_keeps_what_was_in_flight_untouched():
    """A fork child cannot query (or destroy) the parent's CUDA events: it starts with nothing
    in flight and keeps the inherited entries, never asking them anything."""
    import os

    class Untouchable:
        def query(self):
            os._exit(3)  # asked in the child: the test fails

    tt._in_flight.append((Untouchable(), object(), 1))
    tt._held[0] = len(tt._in_flight)
    try:
        pid = os.fork()
        if pid == 0:
            ok = tt.in_flight() == 0 and not tt._in_flight and tt._inherited
            tt._drop_copied()
            os._exit(0 if ok else 4)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        tt._in_flight.clear()
        tt._held[0] = 0


def _stand_in_torch(capturing=False):
    """Just enough of PyTorch for ``_keep_until_copied``: tensors over an address, events that
    remember their stream, a capture flag."""
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

    class Stream(tuple):
        def synchronize(self):
            synced.append(self)

    cuda = types.SimpleNamespace(
        Event=Event,
        current_stream=lambda device: Stream(("stream of", device)),
        is_current_stream_capturing=lambda: capturing,
    )
    return types.SimpleNamespace(Tensor=Tensor, cuda=cuda, strided=strided, sparse=sparse, synced=synced)


def test_only_sources_on_blocks_of_ours_are_held(monkeypatch):
    """The guard holds the storage of a CPU source that starts at a block of ump-alloc's (the
    storage: Module.to swaps a Parameter's data away), with an event on the destination's
    current stream; foreign memory, a view into a block, a CUDA
    source and a copy made during a CUDA graph capture hold nothing."""
    import ctypes

    import numpy as np

    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    try:
        block = np.ones(1 << 16)
        assert ump_alloc.handles(block)
        foreign = ctypes.create_string_buffer(1 << 16)
        monkeypatch.setattr(tt, "_in_flight", __import__("collections").deque())
        monkeypatch.setattr(tt, "_held", [0])
        monkeypatch.setattr(tt, "_held_bytes", [0])
        torch = _stand_in_torch()
        dst = torch.Tensor(0, cuda=True)
        for src in (torch.Tensor(ctypes.addressof(foreign), cuda=False),
                    torch.Tensor(block.ctypes.data + 8, cuda=False)):
            tt._keep_until_copied(src, dst, torch)
        assert tt.in_flight() == 0
        tt._keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False), torch.Tensor(0, cuda=False), torch)
        assert tt.in_flight() == 0, "a copy to the CPU holds nothing"
        capturing = _stand_in_torch(capturing=True)
        tt._keep_until_copied(capturing.Tensor(block.ctypes.data, cuda=False), capturing.Tensor(0, cuda=True), capturing)
        assert tt.in_flight() == 0, "nothing recorded during a capture"
        src = torch.Tensor(block.ctypes.data, cuda=False)
        tt._keep_until_copied(src, dst, torch)
        assert tt.in_flight() == 1
        ev, held, nbytes = tt._in_flight[0]
        assert held.of is src and ev.stream == ("stream of", "cuda:0") and nbytes == src.nbytes, "its storage"
        tt._keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False, layout=torch.sparse), dst, torch)
        assert tt.in_flight() == 1 and not torch.synced, "a sparse source: nothing to hold, no error"
        type(ev).fail = True  # recording fails: the stream is synchronised instead, no error
        tt._keep_until_copied(torch.Tensor(block.ctypes.data, cuda=False), dst, torch)
        assert tt.in_flight() == 1 and torch.synced == [("stream of", "cuda:0")]
    finally:
        ump_alloc.disable()
