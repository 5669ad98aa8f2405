"""No CUDA context until the program uses a GPU (issue 33), over a stand-in CUDA driver.

The stand-in libcuda.so.1 (tests/fork/standin_cuda.c) answers like one GPU without HMM/ATS (so
NumPy's side is pinned host memory) and counts what costs a real process GPU memory:
primary-context retains (each active primary context holds 518 MiB on the lent H100) and host
registrations, which need a context. It reports a primary context active once retained
(``cuDevicePrimaryCtxGetState``), and ``standin_activate()`` plays another library (PyTorch,
CuPy) making one. Managed memory is plain memory here, so a device-side allocation (CuPy's,
PyTorch's segments) runs end to end.

Each program prints one JSON line; every check has a control that shows the violation it
guards against (UMP_ALLOC_PIN=eager, today's behaviour before the change, makes a context at
the first array)."""

import json
import os
import textwrap

import pytest

from conftest import build_stand_in_cuda, run_python, stand_in_env

# The stand-in driver of the fork tests (tests/fork/standin_cuda.c): counts retains and
# registrations, logs the registered ranges, and standin_activate() plays another library
# making a context.
STANDIN = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "fork",
                            "standin_cuda.c")).read()

PRELUDE = textwrap.dedent(
    r"""
    import ctypes, json, os, sys
    import numpy as np
    import ump_alloc

    standin = ctypes.CDLL("libcuda.so.1")

    def counts():
        c = [ctypes.c_long() for _ in range(3)]
        standin.standin_counts(*(ctypes.byref(x) for x in c))
        standin.standin_unregistrations.restype = ctypes.c_long
        standin.standin_inits.restype = ctypes.c_long
        return {"retains": c[0].value, "registrations": c[1].value, "ctx_creates": c[2].value,
                "unregistrations": standin.standin_unregistrations(), "inits": standin.standin_inits()}

    def registered(a):
        return bool(standin.standin_registered(ctypes.c_size_t(a.ctypes.data), ctypes.c_size_t(a.nbytes)))

    def child_reads(arrays, sums):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ok = all(int(a.sum(dtype=np.uint64)) == s for a, s in zip(arrays, sums))
            os.write(w, b"1" if ok else b"0")
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        return os.read(r, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0

    rng = np.random.default_rng(33)
    small = rng.integers(0, 256, 100_000, dtype=np.uint8)   # a small block: in an arena
    big = rng.integers(0, 256, 96 << 20, dtype=np.uint8)    # a large block
    sums = [int(small.sum(dtype=np.uint64)), int(big.sum(dtype=np.uint64))]
    """
)

NUMPY_ONLY = PRELUDE + textwrap.dedent(
    r"""
    before = {"kind": ump_alloc.identify(small).kind, "big_kind": ump_alloc.identify(big).kind,
              "repr": repr(ump_alloc.identify(small))}
    child = child_reads([small, big], sums)
    # The questions a NumPy program may ask: none of them starts the driver.
    st = ump_alloc.stats()
    summary = ump_alloc.memory_summary()
    ump_alloc.trim()
    mode = ump_alloc.mode()
    c = (np.ones(1 << 26) * 2).sum()
    inits_before_caps = counts()["inits"]
    # capabilities() asks the driver about the machine, which starts it (documented); it makes
    # no context either.
    caps = ump_alloc.capabilities()
    print(json.dumps({**before, "counts": counts(), "inits_before_caps": inits_before_caps,
                      "child_ok": child, "host_pinned": caps["host_pinned"], "caps_devices": caps["device_count"], "mode": mode,
                      "summary_says": "not pinned yet" in summary, "device_accessible": ump_alloc.identify(small).device_accessible,
                      "registered": [registered(small), registered(big)]}))
    """
)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return build_stand_in_cuda(tmp_path_factory, STANDIN, "-pthread")


def _run(standin, code, **settings):
    env = stand_in_env(standin, UMP_ALLOC="1", **settings)
    return json.loads(run_python(code, env=env).stdout.strip().splitlines()[-1])


def _shmem_huge() -> bool:
    """Whether this kernel gives shared memory huge pages (then `lazy` keeps large blocks on
    shared pages from the start, as `lazy-all` does)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            chosen = f.read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return False
    return chosen in ("always", "within_size", "advise", "force")


# What a large block made before the first use of a GPU is, per setting: plain host memory
# (never pinned) with `lazy` where shared memory has 4 KiB pages, else pinned host memory.
LAZY = ["lazy", "lazy-all"]


def _big_kind(pin):
    return "host" if pin == "lazy" and not _shmem_huge() else "registered"


@pytest.mark.parametrize("pin", LAZY)
def test_a_numpy_only_process_makes_no_context(standin, pin):
    """The program has the driver library loaded and not initialised, as ``import torch`` leaves
    it (the PRELUDE's ``CDLL``): ump-alloc asks it whether a context is active without calling
    ``cuInit``, after which no fork child could use CUDA (PyTorch's ``test_is_pinned_no_context``)."""
    out = _run(standin, NUMPY_ONLY, UMP_ALLOC_PIN=pin)
    assert out["kind"] == "registered" and out["big_kind"] == _big_kind(pin), out
    counts = dict(out["counts"])
    inits = counts.pop("inits")
    assert counts == {"retains": 0, "registrations": 0, "ctx_creates": 0, "unregistrations": 0}, out
    # Without GPU device nodes (a CPU machine: the stand-in is the only driver) ump-alloc loads
    # the driver at start to learn the machine; with them, never before the first use of a GPU,
    # nor for identify(), stats(), memory_summary(), trim() or mode() (the C export ump_current_mode).
    # capabilities() asks the driver
    # (it reports the devices), and starts it once: a fork child made after it could not use
    # CUDA, as after torch.cuda.is_available().
    assert out["inits_before_caps"] == (0 if os.path.exists("/dev/nvidiactl") else 1), out
    assert inits == 1 and out["caps_devices"] == 1, out
    assert out["mode"] == "pinned", out
    assert out["child_ok"], "a fork child of a not-yet-pinned parent reads its arrays"
    assert not out["host_pinned"] and not out["device_accessible"] and out["registered"] == [False, False], out
    assert "not pinned yet" in out["repr"] and out["summary_says"], out


def test_control_eager_pinning_makes_a_context_at_the_first_array(standin):
    out = _run(standin, NUMPY_ONLY, UMP_ALLOC_PIN="eager")
    assert out["counts"]["retains"] >= 1 and out["counts"]["registrations"] >= 2, out
    assert out["counts"]["inits"] >= 1, out
    assert out["big_kind"] == "registered", out
    assert out["host_pinned"] and out["device_accessible"] and out["registered"] == [True, True], out
    assert "not pinned yet" not in out["repr"] and not out["summary_says"], out
    assert out["child_ok"], out


FIRST_DEVICE_ALLOCATION = PRELUDE + textwrap.dedent(
    r"""
    lib = ctypes.CDLL(ump_alloc.library_path())
    lib.ump_cupy_malloc.restype = ctypes.c_void_p
    lib.ump_cupy_malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lib.ump_cupy_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    child_before = child_reads([small, big], sums)  # shared with a child before the switch
    out = {"before": counts(), "child_before": child_before}
    if os.environ.get("DEVICE_ALLOC") == "1":
        p = lib.ump_cupy_malloc(None, 8 << 20, 0)  # the process's first device-side allocation
        out["device_alloc"] = bool(p)
    out["after"] = counts()
    out["registered"] = [registered(small), registered(big)]
    out["device_accessible"] = ump_alloc.identify(small).device_accessible
    later = rng.integers(0, 256, 80 << 20, dtype=np.uint8)  # a new chunk, pinned as it is made
    out["later_registered"] = registered(later)
    out["child_after"] = child_reads([small, big, later], sums + [int(later.sum(dtype=np.uint64))])
    out["parent_kept"] = [int(small.sum(dtype=np.uint64)), int(big.sum(dtype=np.uint64))] == sums
    out["host_pinned"] = ump_alloc.capabilities()["host_pinned"]
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("pin", LAZY)
def test_the_first_device_allocation_pins_the_arrays_made_before_it(standin, pin):
    """The arena of the small arrays made before is pinned then, and the large one too unless it
    is plain host memory (`lazy` on 4 KiB shared pages); every array made after is pinned."""
    out = _run(standin, FIRST_DEVICE_ALLOCATION, DEVICE_ALLOC="1", UMP_ALLOC_PIN=pin)
    assert out["before"]["retains"] == 0 and out["before"]["registrations"] == 0, out
    assert out["device_alloc"] and out["after"]["retains"] >= 1, out
    assert out["registered"] == [True, _big_kind(pin) == "registered"], out
    assert out["host_pinned"] and out["later_registered"], out
    assert out["child_before"] and out["child_after"] and out["parent_kept"], out


def test_control_without_a_device_allocation_nothing_is_pinned(standin):
    out = _run(standin, FIRST_DEVICE_ALLOCATION, DEVICE_ALLOC="0", UMP_ALLOC_PIN="lazy-all")
    assert out["after"]["retains"] == 0 and out["after"]["registrations"] == 0, out
    assert out["registered"] == [False, False] and not out["later_registered"], out
    assert out["child_after"] and out["parent_kept"], out


CONTEXT_FOUND = PRELUDE + textwrap.dedent(
    r"""
    standin.standin_activate()  # PyTorch or CuPy made a context with their own memory
    later = rng.integers(0, 256, 80 << 20, dtype=np.uint8)  # the next chunk finds it active
    print(json.dumps({"registered": [registered(small), registered(big), registered(later)],
                      "host_pinned": ump_alloc.capabilities()["host_pinned"], "counts": counts()}))
    """
)


@pytest.mark.parametrize("pin", LAZY)
def test_a_context_found_active_when_a_chunk_is_mapped_pins_everything(standin, pin):
    out = _run(standin, CONTEXT_FOUND, UMP_ALLOC_PIN=pin)
    assert out["registered"] == [True, _big_kind(pin) == "registered", True] and out["host_pinned"], out


TRANSFER_CALL = PRELUDE + textwrap.dedent(
    r"""
    before = counts()
    ump_alloc.device_access(small)  # ump-alloc's own transfer call: a use of the GPU
    print(json.dumps({"before": before, "after": counts(), "registered": registered(small),
                      "device_accessible": ump_alloc.identify(small).device_accessible}))
    """
)


def test_a_transfer_call_pins_first(standin):
    out = _run(standin, TRANSFER_CALL)
    assert out["before"]["registrations"] == 0, out
    assert out["registered"] and out["device_accessible"], out


# PyTorch's own TestCuda::test_is_pinned_no_context (test/test_cuda.py; its test files are not in
# the wheel), with a NumPy array made first as any NumPy program under UMP_ALLOC=1 does: asking
# whether a CPU tensor is pinned must not make a context, so that a fork child can still use the
# GPU ("Cannot re-initialize CUDA in forked subprocess" otherwise).
IS_PINNED_NO_CONTEXT = textwrap.dedent(
    r"""
    import multiprocessing, sys
    import numpy as np
    import torch

    a = np.random.default_rng(0).random(1 << 20)  # NumPy's memory: ump-alloc's host side
    x = torch.from_numpy(a)
    x.is_pinned()
    torch.randn(10).is_pinned()
    print("initialized", torch.cuda.is_initialized())

    def worker(conn):
        try:
            conn.send(torch.ones(10, device="cuda")[0].item())
        except Exception as e:
            conn.send("Error: " + str(e))
        finally:
            conn.close()

    parent, child = multiprocessing.get_context("fork").Pipe()
    p = multiprocessing.get_context("fork").Process(target=worker, args=(child,))
    p.start()
    result = parent.recv()
    p.join()
    print("child", result)
    """
)


@pytest.mark.gpu
@pytest.mark.parametrize("pin,expect", [("lazy", "1.0"), ("lazy-all", "1.0"), ("eager", "Error")],
                         ids=["lazy", "lazy-all", "control-eager"])
def test_pytorch_is_pinned_no_context(pin, expect):
    """On a real GPU: PyTorch's test passes under UMP_ALLOC=1; the control (eager pinning, the
    behaviour before issue 33) makes a context at the first array and the fork child fails."""
    pytest.importorskip("torch")
    r = run_python(IS_PINNED_NO_CONTEXT, env={"UMP_ALLOC": "1", "UMP_ALLOC_PIN": pin}, check=False)
    print(r.stdout, r.stderr[-3000:])
    lines = dict(line.split(" ", 1) for line in r.stdout.strip().splitlines() if " " in line)
    assert r.returncode == 0, r.stderr[-3000:]
    assert lines.get("child", "").startswith(expect), r.stdout
    if expect == "1.0":
        assert lines.get("initialized") == "False", r.stdout


NO_CUDA = textwrap.dedent(
    r"""
    import ctypes, json
    import ump_alloc
    standin = ctypes.CDLL("libcuda.so.1")
    standin.standin_inits.restype = ctypes.c_long
    caps = ump_alloc.capabilities()
    print(json.dumps({"inits": standin.standin_inits(), "devices": caps["device_count"]}))
    """
)


@pytest.mark.parametrize("value, driver", [("1", False), ("0", True), ("", True)])
def test_no_cuda_is_read_through_the_configuration_table(standin, value, driver):
    """``UMP_ALLOC_NO_CUDA=1`` keeps the driver unloaded even where one is installed (the
    stand-in here): the CUDA layer asks the configuration table's reading of it. Controls:
    ``0`` and empty (read as unset) load it (capabilities() asks the driver)."""
    env = stand_in_env(standin, UMP_ALLOC_NO_CUDA=value)
    out = json.loads(run_python(NO_CUDA, env=env).stdout.strip().splitlines()[-1])
    assert (out["inits"] == 1 and out["devices"] == 1) if driver else (out["inits"] == 0 and out["devices"] == 0), out
