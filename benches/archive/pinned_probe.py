"""How to make NumPy's host memory reachable by the GPU: cuMemHostRegister on anonymous mappings
against cuMemCreate(CU_MEM_LOCATION_TYPE_HOST_NUMA) + cuMemMap + cuMemSetAccess, measured side
by side (issue 10's choice). Needs a GPU, CuPy and NumPy.

    python benches/archive/pinned_probe.py [--gib 1] [--reps 3] [--json out.json]

For each method: the cost of making 1 GiB (ms; page population included), CPU write and read
bandwidth, GPU kernel read+write bandwidth on the memory in place, DMA copies to and from a
device buffer, the NUMA node the pages are on, and what a fork() child sees: can it read and
write, and are its writes private (copy-on-write) or seen by the parent?
Plain pageable memory (NumPy's default) is measured as the baseline.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benches/
import _benchutil  # noqa: E402 - benches/_benchutil.py

GiB = 1 << 30
libc = _benchutil.libc_memory()
MADV_HUGEPAGE = 14
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError:  # no CUDA driver: main() says "skipped"
    cu = None


def ck(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUDA error {rc}")


class Loc(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Loc),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class Access(ctypes.Structure):
    _fields_ = [("location", Loc), ("flags", ctypes.c_int)]


LOC_DEVICE, LOC_HOST, LOC_HOST_NUMA = 1, 2, 3


def numa_node_of(addr):
    """NUMA node of the page at addr (move_pages with nodes=NULL queries)."""
    SYS_move_pages = 279
    pages = (ctypes.c_void_p * 1)(addr)
    status = (ctypes.c_int * 1)(-1)
    rc = libc.syscall(SYS_move_pages, 0, 1, pages, None, status, 0)
    return int(status[0]) if rc == 0 else None


def view(addr, n):
    return np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(addr))


class Plain:
    name = "pageable (NumPy default)"

    def make(self, n):
        self.a = np.empty(n, np.uint8)
        self.a[::4096] = 0  # first touch
        return self.a.ctypes.data

    def free(self):
        del self.a


class Register:
    def __init__(self, huge):
        self.huge = huge
        self.name = "cuMemHostRegister" + (" + MADV_HUGEPAGE" if huge else " (4 KiB pages)")

    def make(self, n):
        p = libc.mmap(None, n, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
        if self.huge:
            libc.madvise(p, n, MADV_HUGEPAGE)
        ck(cu.cuMemHostRegister_v2(ctypes.c_void_p(p), ctypes.c_size_t(n), 1 | 2), "cuMemHostRegister")
        self.p, self.n = p, n
        return p

    def free(self):
        ck(cu.cuMemHostUnregister(ctypes.c_void_p(self.p)), "cuMemHostUnregister")
        libc.munmap(self.p, self.n)


class Vmm:
    def __init__(self, numa):
        self.numa = numa
        self.name = f"cuMemCreate(HOST_NUMA {numa}) + map + access"

    def make(self, n):
        prop = Prop()
        prop.type = 1  # PINNED
        prop.location = Loc(LOC_HOST_NUMA, self.numa)
        gran = ctypes.c_size_t()
        ck(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(prop), 0), "granularity")
        n = (n + gran.value - 1) // gran.value * gran.value
        h = ctypes.c_ulonglong()
        ck(cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(n), ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
        va = ctypes.c_ulonglong()
        ck(cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(n), ctypes.c_size_t(2 << 20), ctypes.c_ulonglong(0),
                                  ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        ck(cu.cuMemMap(va, ctypes.c_size_t(n), ctypes.c_size_t(0), h, ctypes.c_ulonglong(0)), "cuMemMap")
        ndev = ctypes.c_int()
        cu.cuDeviceGetCount(ctypes.byref(ndev))
        descs = [Access(Loc(LOC_DEVICE, d), 3) for d in range(ndev.value)] + [Access(Loc(LOC_HOST_NUMA, self.numa), 3)]
        arr = (Access * len(descs))(*descs)
        rc = cu.cuMemSetAccess(va, ctypes.c_size_t(n), arr, ctypes.c_size_t(len(descs)))
        if rc != 0:  # host access by HOST (not HOST_NUMA) location
            descs[-1] = Access(Loc(LOC_HOST, 0), 3)
            arr = (Access * len(descs))(*descs)
            ck(cu.cuMemSetAccess(va, ctypes.c_size_t(n), arr, ctypes.c_size_t(len(descs))), "cuMemSetAccess")
        view(va.value, n)[::4096] = 0  # populate as NumPy's first touch would
        self.va, self.h, self.n = va, h, n
        return va.value

    def free(self):
        ck(cu.cuMemUnmap(self.va, ctypes.c_size_t(self.n)), "cuMemUnmap")
        ck(cu.cuMemAddressFree(self.va, ctypes.c_size_t(self.n)), "cuMemAddressFree")
        ck(cu.cuMemRelease(self.h), "cuMemRelease")


def bw(n, f, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t)
    return n / min(ts) / 1e9


def fork_semantics(addr, n):
    a = view(addr, n)
    a[:4096] = 7
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            ok_read = int(a[:4096].sum()) == 7 * 4096
            a[:4096] = 9
            ok_write = int(a[100]) == 9
            os.write(w, bytes([ok_read, ok_write]))
        except BaseException:
            os.write(w, bytes([0, 0]))
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    got = os.read(r, 2)
    crashed = status != 0 or len(got) < 2
    private = int(a[100]) == 7
    return {"child_exit_status": status, "child_read": (not crashed) and bool(got[0]),
            "child_write": (not crashed) and bool(got[1]), "child_writes_private": private}


def measure(m, n, reps):
    import cupy as cp

    out = {"method": m.name}
    t = time.perf_counter()
    try:
        addr = m.make(n)
    except Exception as e:  # noqa: BLE001
        out["error"] = str(e)
        return out
    out["make_ms_per_gib"] = (time.perf_counter() - t) * 1e3 * GiB / n
    a = view(addr, n)
    src = np.full(n, 3, np.uint8)
    out["cpu_write_gbs"] = bw(n, lambda: np.copyto(a, src), reps)
    out["cpu_read_gbs"] = bw(n, lambda: a.view(np.uint64).sum(), reps)
    out["numa_node"] = numa_node_of(addr)
    dev = cp.empty(n, cp.uint8)
    s = cp.cuda.get_current_stream()

    def h2d():
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, addr, n, 1, s.ptr)
        s.synchronize()

    def d2h():
        cp.cuda.runtime.memcpyAsync(addr, dev.data.ptr, n, 2, s.ptr)
        s.synchronize()

    out["h2d_copy_gbs"] = bw(n, h2d, reps)
    out["d2h_copy_gbs"] = bw(n, d2h, reps)
    if m.name.startswith("pageable"):
        out["kernel_rw_gbs"] = None
    else:
        mem = cp.cuda.UnownedMemory(addr, n, None, device_id=0)
        g = cp.ndarray((n // 4,), cp.float32, cp.cuda.MemoryPointer(mem, 0))
        k = cp.ElementwiseKernel("", "float32 y", "y = y * 2.0f + 1.0f", "probe_rw")

        def kern():
            k(g)
            s.synchronize()

        out["kernel_rw_gbs"] = 2 * bw(n, kern, reps)  # bytes read + written
        # The kernel really ran on this memory: check a value.
        a[:4] = np.frombuffer(np.float32(1.5).tobytes(), np.uint8)
        kern()
        out["kernel_checked"] = float(np.frombuffer(a[:4].tobytes(), np.float32)[0]) == 4.0
    out.update(fork_semantics(addr, n))
    t = time.perf_counter()
    m.free()
    out["free_ms_per_gib"] = (time.perf_counter() - t) * 1e3 * GiB / n
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    _benchutil.gpu_or_skip("cupy")
    import cupy as cp

    n = int(args.gib * GiB)
    cp.zeros(1)  # CUDA context
    host_numa = ctypes.c_int(-1)
    dev = ctypes.c_int()
    cu.cuDeviceGet(ctypes.byref(dev), 0)
    cu.cuDeviceGetAttribute(ctypes.byref(host_numa), 134, dev)  # HOST_NUMA_ID
    node = max(host_numa.value, 0)
    rows = []
    for m in (Plain(), Register(True), Register(False), Vmm(node)):
        print(f"measuring {type(m).__name__} ...", file=sys.stderr, flush=True)
        rows.append(measure(m, n, args.reps))
    print(f"{args.gib:g} GiB per method, best of {args.reps}; device 0's host NUMA node: {host_numa.value}")
    keys = ["make_ms_per_gib", "free_ms_per_gib", "cpu_write_gbs", "cpu_read_gbs", "kernel_rw_gbs",
            "h2d_copy_gbs", "d2h_copy_gbs", "numa_node", "child_read", "child_write", "child_writes_private"]
    for r in rows:
        print(r["method"])
        if "error" in r:
            print("   error:", r["error"])
            continue
        for k in keys:
            v = r.get(k)
            print(f"   {k:<22} {v:.1f}" if isinstance(v, float) else f"   {k:<22} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
