"""What kind of pinned host pages NumPy runs fastest on, side by side in one process: the pages
issue 20 moved the pinned host side to (a memory file mapped shared, 4 KiB pages where shared
memory gets no transparent huge pages) against the anonymous pages it left (huge pages through
MADV_HUGEPAGE), the same anonymous pages without huge pages, a hugetlbfs memory file, the CUDA
runtime's own pinned allocation and NumPy's pageable memory. Needs a GPU, CuPy and NumPy.

    python benches/archive/host_pages_probe.py [--gib 2] [--reps 5] [--kinds a,b,...]

Each kind's buffer is filled, registered (cuMemHostRegister, portable + mapped) where that is how
it is made pinned, then, the kinds interleaved in each of --reps rounds: one `a *= 3` pass, one
`a.sum()`, and a DMA copy of a device array into it followed by `a.max()` (issue 22's read after a
device-to-host copy). Prints medians and [fastest-slowest] per kind, how its pages are mapped
(huge or not, from /proc/self/smaps), and the machine's page settings.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
import _benchutil  # noqa: E402 - benches/_benchutil.py

GiB = 1 << 30
libc = _benchutil.libc_memory()
MADV_HUGEPAGE, MADV_NOHUGEPAGE = 14, 15
MAP_FAILED = ctypes.c_void_p(-1).value
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError:  # no CUDA driver: main() says "skipped"
    cu = None


def register(p, n):
    rc = cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1 | 2)
    if rc != 0:
        raise RuntimeError(f"cuMemHostRegister: CUDA error {rc}")


def mapping(n, fd=-1, advice=None):
    flags = mmap.MAP_SHARED if fd >= 0 else mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    p = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if p in (None, MAP_FAILED):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    if advice is not None:
        libc.madvise(p, n, advice)
    return p


def make(kind, n):
    """(address, release) of n bytes of the kind's pages, filled and pinned."""
    import cupy as cp

    if kind == "numpy":
        keep = np.empty(n, np.uint8)
        keep.fill(1)
        return keep.ctypes.data, lambda: keep
    if kind == "cuda_host_alloc":
        p = cp.cuda.runtime.hostAlloc(n, 0)
        ctypes.memset(p, 1, n)
        return p, lambda: cp.cuda.runtime.freeHost(p)
    fd = -1
    if kind.startswith("memfd"):
        fd = os.memfd_create("ump-probe", os.MFD_CLOEXEC | (os.MFD_HUGETLB if kind == "memfd_hugetlb" else 0))
        os.ftruncate(fd, n)
    advice = {"anon_thp": MADV_HUGEPAGE, "anon_4k": MADV_NOHUGEPAGE, "memfd_advise": MADV_HUGEPAGE}.get(kind)
    try:
        p = mapping(n, fd, advice)
    finally:
        if fd >= 0:
            os.close(fd)  # the mapping keeps the file
    ctypes.memset(p, 1, n)
    register(p, n)
    return p, lambda: (cu.cuMemHostUnregister(ctypes.c_void_p(p)), libc.munmap(p, n))


def page_report(addr):
    """The smaps fields that say whether the mapping at addr is huge-page mapped."""
    want = ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped", "KernelPageSize", "Rss")
    out, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head.rstrip(":") in want:
                out[head.rstrip(":")] = " ".join(line.split()[1:])
    return out


def settings():
    rows = {}
    for path in ("/sys/kernel/mm/transparent_hugepage/enabled", "/sys/kernel/mm/transparent_hugepage/shmem_enabled",
                 "/sys/kernel/mm/transparent_hugepage/defrag", "/proc/sys/vm/nr_hugepages",
                 "/proc/sys/vm/nr_overcommit_hugepages"):
        try:
            with open(path) as f:
                rows[path] = f.read().strip()
        except OSError as e:
            rows[path] = f"unreadable ({e.strerror})"
    rows["kernel"] = os.uname().release
    rows["euid"] = os.geteuid()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=2.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--kinds", default="anon_thp,anon_4k,memfd,memfd_advise,memfd_hugetlb,cuda_host_alloc,numpy")
    args = p.parse_args()
    _benchutil.gpu_or_skip("cupy")
    import cupy as cp

    for k, v in settings().items():
        print(f"{k}: {v}")
    n = int(args.gib * GiB) // (2 << 20) * (2 << 20)
    dev = cp.random.random(n // 8)
    want_max = float(dev.max())
    stream = cp.cuda.get_current_stream()
    bufs = {}
    for kind in args.kinds.split(","):
        t = time.perf_counter()
        try:
            bufs[kind] = make(kind, n)
        except (OSError, RuntimeError) as e:
            print(f"{kind}: not made ({e})")
            continue
        print(f"{kind}: made, filled and pinned in {time.perf_counter() - t:.3f} s; pages {page_report(bufs[kind][0])}")
    times = {k: {"a *= 3": [], "a.sum()": [], "d2h + a.max()": []} for k in bufs}
    for _ in range(args.reps):
        for kind, (addr, _) in bufs.items():
            a = np.ctypeslib.as_array((ctypes.c_double * (n // 8)).from_address(addr))
            t = time.perf_counter()
            a *= 3
            times[kind]["a *= 3"].append(time.perf_counter() - t)
            t = time.perf_counter()
            a.sum()
            times[kind]["a.sum()"].append(time.perf_counter() - t)
            a[::4096] = -1.0  # poison: the copy must overwrite it
            t = time.perf_counter()
            cp.cuda.runtime.memcpyAsync(addr, dev.data.ptr, n, 2, stream.ptr)
            stream.synchronize()
            got = float(a.max())
            times[kind]["d2h + a.max()"].append(time.perf_counter() - t)
            if got != want_max:
                raise SystemExit(f"{kind}: the copy read back {got}, not {want_max}")
    print(f"\n{n / GiB:g} GiB float64, {args.reps} interleaved rounds; seconds, median [fastest-slowest]")
    base = "anon_thp" if "anon_thp" in times else next(iter(times))
    for op in ("a *= 3", "a.sum()", "d2h + a.max()"):
        print(f"\n{op}")
        ref = statistics.median(times[base][op])
        for kind, ops in times.items():
            ts = ops[op]
            med = statistics.median(ts)
            print(f"  {kind:<16} {med:.4f} [{min(ts):.4f}-{max(ts):.4f}]  {med / ref:.3f}x {base}")
    for _, release in bufs.values():
        release()


if __name__ == "__main__":
    main()
