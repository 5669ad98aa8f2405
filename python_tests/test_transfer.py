"""The transfer plan (issue 22): the decision between a view and a DMA copy, tested without a
GPU through the library's pure function (``ump_decide_transfer``), and what ``asnumpy`` /
``asarray`` / ``host_access`` accept. The GPU outcomes are in gpu_checks.py
(``transfer_choice_*``)."""

import numpy as np
import pytest

import ump_alloc
from conftest import GPU
from ump_alloc import _zerocopy

# (to, memory, resident, coherent, touch) -> (path, view_possible, view_move) on a 1 GiB array.
RULES = [
    # To the host: GPU-written managed memory read whole is copied (DMA into pinned memory);
    # a view asked for anyway migrates in the background.
    (("host", "managed", "device", False, 1.0), ("copy", True, "background")),
    (("host", "managed", "unknown", False, None), ("copy", True, "background")),
    # ... read sparsely it is a view that moves nothing (faults bring what is touched).
    (("host", "managed", "device", False, 0.01), ("view", True, "none")),
    (("host", "managed", "device", False, 0.2), ("view", True, "none")),
    (("host", "managed", "device", False, 0.3), ("copy", True, "background")),
    # Already where the reader is.
    (("host", "managed", "host", False, 1.0), ("view", True, "background")),
    (("host", "pinned", "host", False, 1.0), ("view", True, "none")),
    (("host", "pageable", "host", False, 5.0), ("view", True, "none")),
    # The host cannot read device memory: only a copy, on any machine.
    (("host", "device", "device", False, 0.01), ("copy", False, "none")),
    (("host", "device", "device", True, 1.0), ("copy", False, "none")),
    # To a device: pinned host memory read whole (or several times) is copied; sparse: a view.
    (("device", "pinned", "host", False, 1.0), ("copy", True, "none")),
    (("device", "pinned", "host", False, 3.0), ("copy", True, "none")),
    (("device", "pinned", "host", False, 0.4), ("view", True, "none")),
    (("device", "pinned", "host", False, 0.01), ("view", True, "none")),
    # Managed memory goes over by a stream-ordered prefetch (as fast as a DMA), or by faults
    # when kernels touch little.
    (("device", "managed", "host", False, 1.0), ("view", True, "prefetch")),
    (("device", "managed", "device", False, 1.0), ("view", True, "prefetch")),
    (("device", "managed", "host", False, 0.05), ("view", True, "none")),
    (("device", "device", "device", False, 1.0), ("view", True, "none")),
    # Pageable memory reaches a GPU only on a coherent machine.
    (("device", "pageable", "host", False, 0.01), ("copy", False, "none")),
    (("device", "pageable", "host", True, 1.0), ("view", True, "none")),
    # Coherent machines (HMM/ATS): a view wherever the reader can reach the memory.
    (("host", "managed", "device", True, 1.0), ("view", True, "background")),
    (("device", "pinned", "host", True, 10.0), ("view", True, "none")),
]


@pytest.mark.parametrize("facts,want", RULES, ids=[f"{f[0]}-{f[1]}-{f[2]}-{'coh' if f[3] else 'pcie'}-{f[4]}" for f, _ in RULES])
def test_decision_table(facts, want):
    to, memory, resident, coherent, touch = facts
    p = ump_alloc.decide_transfer(to, memory, resident, coherent, 1 << 30, touch)
    assert (p.path, p.view_possible, p.view_move) == want, p
    assert p.reason and p.to == to and p.memory == memory and p.coherent == coherent
    assert p.touch == (1.0 if touch is None else touch) and p.nbytes == 1 << 30


def test_a_view_of_managed_memory_moves_pages_by_size():
    """Below UMP_ALLOC_PREFETCH_MIN (64 KiB) nothing moves; below 8 MiB a prefetch; from 8 MiB a
    background migration."""
    moves = [ump_alloc.decide_transfer("host", "managed", "device", nbytes=n).view_move for n in
             (1 << 10, 64 << 10, (8 << 20) - 1, 8 << 20)]
    assert moves == ["none", "prefetch", "prefetch", "background"]
    zero = ump_alloc.decide_transfer("host", "managed", "device", nbytes=0)
    assert (zero.path, zero.view_move) == ("view", "none")


def test_decide_refuses_bad_facts():
    with pytest.raises(ValueError, match="memory must be one of"):
        ump_alloc.decide_transfer("host", "hbm")
    with pytest.raises(ValueError, match="to must be one of"):
        ump_alloc.decide_transfer("gpu", "managed")
    with pytest.raises(ValueError, match="resident"):
        ump_alloc.decide_transfer("host", "managed", "disk")
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="touch"):
            ump_alloc.decide_transfer("host", "managed", touch=bad)
    with pytest.raises(TypeError, match="touch"):
        ump_alloc.decide_transfer("host", "managed", touch="all")
    with pytest.raises(ValueError, match="nbytes"):
        ump_alloc.decide_transfer("host", "managed", nbytes=-1)


def test_the_c_decision_refuses_out_of_range_facts(lib):
    """The C entry point checks every field itself (a C caller has no Python wrapper) and
    writes nothing on failure."""
    import ctypes

    from ump_alloc import _lib

    f = _lib.TransferFacts(size=ctypes.sizeof(_lib.TransferFacts), direction=0, memory=9, resident=0, coherent=0,
                           bytes=1, touch=1.0)
    p = _lib.TransferPlan(size=ctypes.sizeof(_lib.TransferPlan), path=77)
    assert lib.ump_decide_transfer(ctypes.byref(f), ctypes.byref(p)) == _lib.ERR_INVALID
    assert p.path == 77 and "memory 9" in ump_alloc.last_error()
    f.memory = 2
    assert lib.ump_decide_transfer(ctypes.byref(f), ctypes.byref(p)) == _lib.OK and p.path in (0, 1)


def test_plan_of_host_memory(ump):
    a = np.random.default_rng(5).random(100_000)
    p = ump_alloc.transfer_plan(a, to="host")
    assert (p.path, p.to, p.resident, p.nbytes) == ("view", "host", "host", a.nbytes)
    to_dev = ump_alloc.transfer_plan(a[::2], touch=0.5)
    assert to_dev.to == "device" and to_dev.touch == 0.5
    assert to_dev.nbytes == a.nbytes - a.itemsize  # the bytes the strides reach
    if not GPU:
        # No GPU: nothing reaches this memory from a device, so it is only a copy.
        assert (to_dev.path, to_dev.view_possible) == ("copy", False), to_dev
    foreign = np.arange(1000.0)  # NumPy's own allocator (the fixture's handler is ump-alloc's)
    assert ump_alloc.transfer_plan(foreign[:0], to="host").nbytes == 0
    with pytest.raises(ValueError, match="to must be"):
        ump_alloc.transfer_plan(a, to="gpu")
    with pytest.raises(ValueError, match="touch"):
        ump_alloc.transfer_plan(a, touch=-1)


def test_resolve_follows_numpys_copy_argument():
    view = ump_alloc.decide_transfer("device", "pinned", touch=0.01)
    copy = ump_alloc.decide_transfer("device", "pinned")
    never = ump_alloc.decide_transfer("host", "device")
    assert _zerocopy._resolve(view, None) and not _zerocopy._resolve(copy, None)
    assert not _zerocopy._resolve(view, True) and _zerocopy._resolve(copy, False)
    assert not _zerocopy._resolve(never, None) and not _zerocopy._resolve(never, True)
    with pytest.raises(ValueError, match="copy=False.*host cannot read"):
        _zerocopy._resolve(never, False)
    with pytest.raises(ValueError, match="read-only"):
        _zerocopy._resolve(view, False, "the array is read-only")
    assert not _zerocopy._resolve(view, None, "the array is read-only"), "a reason against a view wins"
    assert _zerocopy._resolve(copy, np.False_)


def test_asnumpy_and_asarray_check_their_arguments():
    a = np.arange(6.0)
    assert ump_alloc.asnumpy(a) is a and ump_alloc.asnumpy(a, copy=False) is a
    c = ump_alloc.asnumpy(a, copy=True)
    assert c is not a and np.array_equal(c, a) and not np.shares_memory(c, a)
    with pytest.raises(TypeError, match="copy must be"):
        ump_alloc.asnumpy(a, copy="yes")
    with pytest.raises(ValueError, match="touch"):
        ump_alloc.asnumpy(a, touch=float("nan"))
    with pytest.raises(TypeError, match="copy must be"):
        ump_alloc.asarray(a, like="cupy", copy=1)
    with pytest.raises(ValueError, match="like"):
        ump_alloc.asarray(a, like="jax", copy=False)


def test_host_access_takes_the_readers_touch(ump):
    a = np.random.default_rng(7).random(50_000)
    ump_alloc.host_access(a, touch=0.01)
    ump_alloc.host_access(a, touch=1)
    with pytest.raises(ValueError, match="touch"):
        ump_alloc.host_access(a, touch=-2)
    if not GPU:
        with pytest.raises(ump_alloc.UmpError) as e:
            ump_alloc.device_access(a, touch=0.5)
        assert e.value.status_name == "UMP_ERR_UNSUPPORTED"
