"""No thread and no CUDA initialisation before they are needed (issue 20): a NumPy program on the
plain host side (UMP_ALLOC_HOST_SIDE=host) must not become multi-threaded because of ump-alloc,
nor initialise CUDA (its fork() children could then not use CUDA, and Python 3.12 warns at every
os.fork() in a multi-threaded process).

This machine may have no CUDA driver, so the tests load a stand-in libcuda.so.1 whose cuInit
starts a thread, as the real driver's initialisation may: the thread count, and whether the
library is mapped at all, tell whether ump-alloc called into it."""

import textwrap

import pytest

from conftest import build_stand_in_cuda, run_python, stand_in_env

FAKE_CUDA = textwrap.dedent(
    r"""
    #include <pthread.h>
    #include <unistd.h>
    static void *idle(void *arg) { for (;;) pause(); return arg; }
    /* CUDA_ERROR_NO_DEVICE, after starting a thread as a driver's initialisation may. */
    int cuInit(unsigned flags) {
        pthread_t t;
        (void)flags;
        pthread_create(&t, 0, idle, 0);
        return 100;
    }
    #define STUB(name) int name(void) { return 100; }
    STUB(cuDriverGetVersion) STUB(cuDeviceGetCount) STUB(cuDeviceGet) STUB(cuDeviceGetName)
    STUB(cuDeviceGetAttribute) STUB(cuDeviceTotalMem_v2) STUB(cuDevicePrimaryCtxRetain)
    STUB(cuCtxPushCurrent_v2) STUB(cuCtxPopCurrent_v2) STUB(cuMemAlloc_v2) STUB(cuMemAllocManaged)
    STUB(cuMemFree_v2) STUB(cuMemHostRegister_v2) STUB(cuMemHostUnregister) STUB(cuMemGetInfo_v2)
    STUB(cuStreamSynchronize) STUB(cuCtxSynchronize) STUB(cuStreamWaitEvent) STUB(cuEventCreate)
    STUB(cuEventRecord) STUB(cuEventQuery) STUB(cuEventSynchronize) STUB(cuEventDestroy_v2)
    STUB(cuPointerGetAttributes) STUB(cuGetErrorName) STUB(cuStreamCreate)
    """
)

PROGRAM = textwrap.dedent(
    r"""
    import os, sys
    import numpy as np
    import ump_alloc

    def threads():
        return len(os.listdir("/proc/self/task"))

    def cuda_loaded():
        with open("/proc/self/maps") as f:
            return "libcuda.so" in f.read()

    start = threads()
    ump_alloc.enable(cupy=False, torch=False)
    arrays = [np.random.default_rng(i).random(n) for i, n in enumerate((10, 1000, 1 << 20, 1 << 23))]
    total = sum(float(a.sum()) for a in arrays)
    assert ump_alloc.handles(arrays[-1])
    pid = os.fork()
    if pid == 0:
        ok = abs(sum(float(a.sum()) for a in arrays) - total) < 1e-6 and ump_alloc.handles(np.ones(1 << 20))
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    print("after-numpy", start, threads(), cuda_loaded(), os.waitstatus_to_exitcode(status))
    ump_alloc.mode()  # a question about the GPU side: now the machine is asked
    print("after-mode", threads(), cuda_loaded(), ump_alloc.mode())
    """
)


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory):
    # nodelete: the library is closed when cuInit fails, while its thread still runs there.
    return build_stand_in_cuda(tmp_path_factory, FAKE_CUDA, "-Wl,-z,nodelete", "-lpthread")


def _run(fake_cuda, env):
    e = stand_in_env(fake_cuda, **env)
    r = run_python(PROGRAM, env=e)
    lines = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()}
    return lines["after-numpy"], lines["after-mode"]


def test_a_plain_host_side_starts_no_thread_and_loads_no_cuda(fake_cuda):
    numpy, mode = _run(fake_cuda, {"UMP_ALLOC_HOST_SIDE": "host"})
    start, after, loaded, child = numpy
    assert start == after == "1", f"threads: {start} at start, {after} after NumPy and a fork"
    assert loaded == "False", "libcuda was loaded by a NumPy-only program"
    assert child == "0", "the fork child read wrong data"
    # Asking about the device side does need the driver: the stand-in is real.
    threads, loaded, name = mode
    assert loaded == "True" and threads == "2", mode
    assert name == "host", "the stand-in reports no device"


def test_mode_host_needs_no_cuda_even_when_asked(fake_cuda):
    numpy, mode = _run(fake_cuda, {"UMP_ALLOC_MODE": "host"})
    assert numpy[1:3] == ["1", "False"]
    assert mode == ["1", "False", "host"]


def test_control_the_default_sides_ask_the_machine_at_once(fake_cuda):
    """Control: with the host side left to auto, choosing it needs the machine at enable();
    the stand-in's thread shows up, so the tests above can fail."""
    numpy, _ = _run(fake_cuda, {})
    start, after, loaded, child = numpy
    assert start == "1" and after == "2" and loaded == "True", numpy
    assert child == "0"
