"""The pinned host side end to end on a machine without a GPU, over a stand-in CUDA driver.

The stand-in libcuda.so.1 answers like one GPU without HMM/ATS (so NumPy's side is pinned host
memory), and its cuMemHostRegister pins nothing: it records each range and how many of its pages
were already resident (mincore) when the registration came. A real driver faults in whatever is
not resident, one 4 KiB page at a time for the memory file's pages; ump-alloc faults a large
chunk's shared pages in from several threads first (issue 20, docs/benchmarks-archive.md, "fork() and the pinned host side"), so every page of
such a chunk must be resident when it is registered. The control, UMP_ALLOC_PINNED_FORK=copy
(anonymous pages, huge pages where the kernel gives them, left to the registration), shows a
registration that finds the pages absent. The same program checks what the pinned pages must
do around fork() on the default setting: the child reads the parent's array and its writes stay
its own."""

import json
import textwrap

import pytest

from conftest import build_stand_in_cuda, run_python, stand_in_env

STANDIN = textwrap.dedent(
    r"""
    #include <stdint.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/mman.h>
    #include <unistd.h>

    enum { PAGEABLE_MEMORY_ACCESS = 88, USES_HOST_PAGE_TABLES = 100, LOG = 256 };
    static size_t sizes[LOG], resident[LOG];
    static int count;

    int cuInit(unsigned flags) { (void)flags; return 0; }
    int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
    int cuDeviceGetCount(int *n) { *n = 1; return 0; }
    int cuDeviceGet(int *d, int i) { *d = i; return i == 0 ? 0 : 101; }
    int cuDeviceGetName(char *s, int len, int d) { (void)d; strncpy(s, "stand-in", len); return 0; }
    /* No HMM/ATS; everything else (managed memory, host registration) supported. */
    int cuDeviceGetAttribute(int *v, int attr, int d) {
        (void)d;
        *v = attr == PAGEABLE_MEMORY_ACCESS || attr == USES_HOST_PAGE_TABLES ? 0 : 1;
        return 0;
    }
    int cuDeviceTotalMem_v2(size_t *b, int d) { (void)d; *b = (size_t)16 << 30; return 0; }
    int cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)0x1; return 0; }
    int cuCtxPushCurrent_v2(void *c) { (void)c; return 0; }
    int cuCtxPopCurrent_v2(void **c) { if (c) *c = (void *)0x1; return 0; }
    int cuMemGetInfo_v2(size_t *f, size_t *t) { *f = (size_t)8 << 30; *t = (size_t)16 << 30; return 0; }
    int cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_ERROR_STANDIN"; return 0; }
    int cuMemHostUnregister(void *p) { (void)p; return 0; }

    /* Pins nothing: records the range and its resident pages at the moment of the call. */
    int cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
        (void)flags;
        long page = sysconf(_SC_PAGESIZE);
        size_t pages = (n + page - 1) / page, in = 0;
        unsigned char *v = malloc(pages);
        if (v && mincore(p, n, v) == 0)
            for (size_t i = 0; i < pages; i++) in += v[i] & 1;
        free(v);
        if (count < LOG) sizes[count] = n, resident[count] = in * page, count++;
        return 0;
    }
    /* For the test: the registrations so far. */
    int standin_registrations(size_t *n, size_t *in, int max) {
        int k = count < max ? count : max;
        for (int i = 0; i < k; i++) n[i] = sizes[i], in[i] = resident[i];
        return k;
    }

    #define FAIL(name) int name(void) { return 801; }  /* CUDA_ERROR_NOT_SUPPORTED */
    FAIL(cuMemAlloc_v2) FAIL(cuMemAllocManaged) FAIL(cuMemFree_v2) FAIL(cuStreamSynchronize)
    FAIL(cuCtxSynchronize) FAIL(cuStreamWaitEvent) FAIL(cuEventCreate) FAIL(cuEventRecord)
    FAIL(cuEventQuery) FAIL(cuEventSynchronize) FAIL(cuEventDestroy_v2) FAIL(cuPointerGetAttributes)
    FAIL(cuStreamCreate)
    """
)

PROGRAM = textwrap.dedent(
    r"""
    import ctypes, json, os
    import numpy as np
    import ump_alloc

    ump_alloc.enable(cupy=False, torch=False)
    standin = ctypes.CDLL("libcuda.so.1")
    threads = len(os.listdir("/proc/self/task"))
    n = 192 << 20
    a = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    threads_after = len(os.listdir("/proc/self/task"))
    total = int(a.sum(dtype=np.uint64))
    sizes, res = (ctypes.c_size_t * 256)(), (ctypes.c_size_t * 256)()
    k = standin.standin_registrations(sizes, res, 256)
    regs = [(sizes[i], res[i]) for i in range(k)]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ok = int(a.sum(dtype=np.uint64)) == total
        a[:: 1 << 20] += 1  # private to the child
        os.write(w, b"1" if ok and int(a.sum(dtype=np.uint64)) != total else b"0")
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    child_ok = os.read(r, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
    print(json.dumps({"kind": ump_alloc.identify(a).kind, "regs": regs, "n": n,
                      "threads": [threads, threads_after], "child_ok": child_ok,
                      "parent_kept": int(a.sum(dtype=np.uint64)) == total,
                      "fork_rule": ump_alloc.capabilities()["fork_shared"]}))
    """
)


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    return build_stand_in_cuda(tmp_path_factory, STANDIN)


def _run(standin, env):
    e = stand_in_env(standin, **env)
    out = json.loads(run_python(PROGRAM, env=e).stdout.strip().splitlines()[-1])
    big = [(size, res) for size, res in out["regs"] if size >= out["n"]]
    assert out["kind"] == "registered", out
    assert len(big) == 1, out["regs"]
    return out, big[0]


def test_a_large_shared_chunk_is_resident_before_it_is_registered(standin):
    # Pinned as it is made (this stand-in cannot say whether a context is active, so lazy
    # pinning would wait for a device allocation: test_no_context.py covers that way).
    out, (size, resident) = _run(standin, {"UMP_ALLOC": "1", "UMP_ALLOC_PIN": "eager"})
    assert out["fork_rule"] is True, out
    assert resident == size, f"{resident} of {size} bytes resident when registered"
    # The threads that faulted the pages in are gone when the allocation returns.
    assert out["threads"][1] == out["threads"][0], out["threads"]
    assert out["child_ok"] and out["parent_kept"], out


def test_control_anonymous_pinned_pages_are_left_to_the_registration(standin):
    out, (size, resident) = _run(standin, {"UMP_ALLOC": "1", "UMP_ALLOC_PINNED_FORK": "copy", "UMP_ALLOC_PIN": "eager"})
    assert out["fork_rule"] is False, out
    assert resident < size // 100, f"{resident} of {size} bytes resident when registered"
    assert out["child_ok"] and out["parent_kept"], out


@pytest.mark.parametrize(
    "setting, size",
    [
        ("always within_size advise [never] deny force\n", "4 KiB"),
        ("always within_size [advise] never deny force\n", "2 MiB"),
        ("[always] within_size advise never deny force\n", "2 MiB"),
        ("always within_size advise never [deny] force\n", "4 KiB"),
        ("always within_size advise never deny [force]\n", "2 MiB"),
        (None, "4 KiB"),
    ],
)
def test_info_reads_the_size_of_shared_pages_from_the_kernel(tmp_path, setting, size):
    """`shared_pages` reads the bracketed choice of the kernel's shmem_enabled (a missing file:
    a kernel without huge shared pages); with 4 KiB pages it names what fork children pay and
    the setting that removes it."""
    from ump_alloc.__main__ import shared_pages

    path = tmp_path / "shmem_enabled"
    if setting is not None:
        path.write_text(setting)
    line = shared_pages(str(path))
    assert line.startswith(size), line
    assert ("fork child" in line and "advise" in line) == (size == "4 KiB" and setting is not None), line


@pytest.mark.parametrize("total, says", [(0, False), (512, True), (None, False)])
def test_info_says_why_reserved_hugetlb_pages_are_not_used(tmp_path, total, says):
    """`hugetlb_pages` reads HugePages_Total from meminfo: reserved pages get a line saying why
    the shared pages do not use them (what a fork child would need); none reserved, or no
    such line (a kernel without hugetlb), gets none."""
    from ump_alloc.__main__ import hugetlb_pages

    path = tmp_path / "meminfo"
    lines = ["MemTotal:       24000000 kB", "HugePages_Free:        0"]
    if total is not None:
        lines.insert(1, f"HugePages_Total:    {total}")
    path.write_text("\n".join(lines) + "\n")
    line = hugetlb_pages(str(path))
    assert (line is not None) == says, line
    if says:
        assert line.startswith(f"{total} reserved hugetlb pages, not used") and "fork child" in line, line
    assert hugetlb_pages(str(tmp_path / "missing")) is None


def test_info_shows_the_shared_page_size_with_the_pinned_host_side(standin):
    """Over the stand-in driver (pinned host side, shared with children) `info` prints the size
    of the shared pages as this machine's kernel gives them; the control, copy mode (anonymous
    pinned pages), prints no such line."""
    from ump_alloc.__main__ import SHMEM_THP, shared_pages

    def info(**settings):
        e = stand_in_env(standin, **settings)
        return run_python("import sys, ump_alloc.__main__ as m; sys.argv = ['ump_alloc', 'info']; sys.exit(m.main())",
                          env=e).stdout

    out = info(UMP_ALLOC="1")
    host = out.split("host side (NumPy):")[1].split("device side")[0]
    assert "pinned" in host and "fork(): share" in host, out
    assert f"shared pages: {shared_pages(SHMEM_THP)}" in host, out
    control = info(UMP_ALLOC="1", UMP_ALLOC_PINNED_FORK="copy").split("host side (NumPy):")[1]
    assert "fork(): copy" in control and "shared pages:" not in control, control


HOST_EMPTY = textwrap.dedent(
    """
    import json, sys
    if sys.argv[-1] == "without":
        sys.modules["numpy_allocator"] = None  # not installed: the default route needs none
    import numpy as np
    import ump_alloc
    from ump_alloc import _zerocopy
    a = _zerocopy._host_empty((1000, 3), np.float64, "F")
    print(json.dumps({"ours": ump_alloc.handles(a), "kind": ump_alloc.identify(a).kind,
                      "fortran": a.flags.f_contiguous, "mode": ump_alloc.mode()}))
    """
)


@pytest.mark.parametrize("numpy_allocator", ["without", "with"])
def test_copies_to_the_host_land_on_the_host_side_without_numpy_allocator(standin, numpy_allocator):
    """The array a copy from the GPU lands in (``asnumpy``'s copy path) is on ump-alloc's host
    side, pinned here, on NumPy's default route whether or not numpy_allocator is installed (it
    raised 'UMP_ALLOC_NUMPY_ROUTE=numpy_allocator, but ... not installed' without it)."""
    if numpy_allocator == "with":
        pytest.importorskip("numpy_allocator")
    code = HOST_EMPTY.replace('sys.argv[-1] == "without"', repr(numpy_allocator == "without"))
    out = json.loads(run_python(code, env=stand_in_env(standin, UMP_ALLOC="1")).stdout.splitlines()[-1])
    assert out["mode"] != "host" and out["ours"] and out["fortran"], out
