"""CuPy allocation latency: alloc+free through CuPy's default pool and ump-alloc's allocators,
side by side in one process (the allocator is switched between rounds, rounds interleaved;
medians of the rounds).

    python benches/cupy_alloc_bench.py [--n 200000] [--rounds 7] [--sizes 256,4096,1048576] [--detail]

Columns: ``cupy pool`` (CuPy's default MemoryPool), ``ump direct`` (the builtin that makes
CuPy's objects itself, what ``enable()`` installs), ``ump bound`` (the builtin calling a
``CFunctionAllocator.malloc``), ``ump python`` (the Python fallback), ``C floor`` (CuPy's own
cost around a C allocator whose functions do nothing). ``--detail`` adds the pieces: the
builtin over the do-nothing functions, ump-alloc's ``CFunctionAllocator`` without a builtin,
the do-nothing functions plus a read of CuPy's current stream (through ``cupy.cuda.stream``'s
and ``cupy_backends``' C functions), and plain C loops of ``ump_cupy_malloc``/``ump_cupy_free``
pairs. Pin it to one core for stable numbers (``taskset -c 3``). Exits 0 with a message
without a GPU or CuPy (or without a C compiler, for the floor and the details).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

_TRIVIAL_C = r"""
#include <stddef.h>
#include <stdint.h>
#include <time.h>
static char buf[1 << 20];
static intptr_t (*cur)(int);
volatile intptr_t triv_sink;
void triv_set(void *f) { cur = (intptr_t (*)(int))f; }
void *triv_malloc(void *p, size_t s, int d) { (void)p; (void)s; (void)d; return buf; }
void triv_free(void *p, void *q, int d) { (void)p; (void)q; (void)d; }
void *triv_malloc_stream(void *p, size_t s, int d) { (void)p; (void)s; (void)d; triv_sink = cur(1); return buf; }
typedef void *(*m_t)(void *, size_t, int);
typedef void (*f_t)(void *, void *, int);
double triv_loop(void *m, void *f, void *param, size_t size, long n) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        void *q = ((m_t)m)(param, size, 0);
        if (!q) return -1.0;
        ((f_t)f)(param, q, 0);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / (double)n;
}
"""


def _trivial_lib():
    """The do-nothing C allocator (built with cc), loaded with the GIL kept held; or None."""
    import ctypes
    import os
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    d = tempfile.mkdtemp()
    src, so = os.path.join(d, "triv.c"), os.path.join(d, "libtriv.so")
    with open(src, "w") as f:
        f.write(_TRIVIAL_C)
    if subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", so, src]).returncode != 0:
        return None
    lib = ctypes.PyDLL(so)  # PyDLL: the GIL stays held (CuPy's stream function needs it)
    lib.triv_loop.restype = ctypes.c_double
    lib.triv_loop.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_size_t, ctypes.c_long]
    lib.triv_set.argtypes = [ctypes.c_void_p]
    return lib


def _addr(fn) -> int:
    import ctypes

    return ctypes.cast(fn, ctypes.c_void_p).value


# From include/ump_alloc.h: the `param` with which ump_cupy_malloc/ump_cupy_free serve CuPy's
# current stream (read in C; needs the fast path's C functions, which enable() hands over).
UMP_CUPY_CURRENT_STREAM = -2
_METH_O = 0x0008


def _builtin(lib, fn_name: str, self_tuple):
    """A Python builtin (``PyCFunction_NewEx``, ``METH_O``) over the library's C function
    ``fn_name`` (``ump_cupy_allocator``: calls ``self_tuple[0]``, a ``CFunctionAllocator``'s
    ``malloc``, and ``self_tuple[1]`` to raise on failure), as ump-alloc makes its own."""
    import ctypes

    class MethodDef(ctypes.Structure):
        _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                    ("ml_doc", ctypes.c_char_p)]

    md = MethodDef(fn_name.encode(), _addr(getattr(lib, fn_name)), _METH_O, None)
    _KEEP.append(md)  # the builtin points at it for good
    api = ctypes.pythonapi
    api.PyCFunction_NewEx.restype = ctypes.py_object
    api.PyCFunction_NewEx.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.c_void_p]
    return api.PyCFunction_NewEx(ctypes.addressof(md), self_tuple, None)


_KEEP: list = []


def _python_allocator(cp, lib, um, uf):
    """ump-alloc's Python fallback, rebuilt here: a Python function per allocation, one
    ``CFunctionAllocator`` per stream whose ``param`` is that stream's handle."""
    CFA = cp.cuda.memory.CFunctionAllocator
    get_current_stream = cp.cuda.get_current_stream
    by_stream: dict = {}

    def ump_cupy_malloc(size):
        s = get_current_stream().ptr
        c_malloc = by_stream.get(s)
        if c_malloc is None:
            c_malloc = by_stream[s] = CFA(s, um, uf, lib).malloc
        mem = c_malloc(size)
        if mem.ptr == 0 and size > 0:
            raise MemoryError(size)
        return mem

    return ump_cupy_malloc


def _capi_function(module_name: str, fn: str) -> int:
    """The C function ``fn`` that a Cython module of CuPy exports (``__pyx_capi__``), for
    ``intptr_t (void)`` or the cpdef ``intptr_t (int __pyx_skip_dispatch)``; 0 if none."""
    import ctypes
    import importlib

    try:
        capsule = (getattr(importlib.import_module(module_name), "__pyx_capi__", None) or {}).get(fn)
    except Exception:  # noqa: BLE001 - another CuPy layout
        return 0
    if capsule is None:
        return 0
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype = ctypes.c_char_p
    api.PyCapsule_GetName.argtypes = [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    name = api.PyCapsule_GetName(capsule)
    if name not in (b"intptr_t (void)", b"intptr_t (int __pyx_skip_dispatch)"):
        return 0
    return api.PyCapsule_GetPointer(capsule, name) or 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000, help="alloc+free pairs per round")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--sizes", default="256,4096,1048576")
    p.add_argument("--detail", action="store_true", help="also measure the pieces (see above)")
    args = p.parse_args()
    try:
        import cupy as cp

        cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001
        print(f"skipped: no CuPy GPU ({e})")
        return 0
    import ctypes

    import ump_alloc

    pool = cp.get_default_memory_pool().malloc
    ump_alloc.enable(torch=False)  # CuPy is imported: its allocator is ump-alloc's from here on
    direct = cp.cuda.get_allocator()
    if getattr(direct, "__name__", "") != "ump_cupy_allocator_direct":
        print(f"the C fast path's direct builtin is not available with this CuPy (enable() installed "
              f"{direct!r}; python -m ump_alloc info says why)", file=sys.stderr)
        return 1
    # The library ump_alloc loaded (the same file, so the same handle and state), through ctypes:
    # its C functions, not the package's private modules.
    lib = ctypes.CDLL(ump_alloc.library_path())
    CFA = cp.cuda.memory.CFunctionAllocator
    um, uf = _addr(lib.ump_cupy_malloc), _addr(lib.ump_cupy_free)

    def raise_oom(size):
        raise MemoryError(size)

    allocators = {
        "cupy pool": pool,
        "ump direct": direct,
        "ump bound": _builtin(lib, "ump_cupy_allocator", (CFA(UMP_CUPY_CURRENT_STREAM, um, uf, lib).malloc, raise_oom)),
        "ump python": _python_allocator(cp, lib, um, uf),
    }
    triv = _trivial_lib()
    if triv is not None:
        allocators["C floor"] = CFA(0, _addr(triv.triv_malloc), _addr(triv.triv_free), triv).malloc
    loops = {}
    if args.detail and triv is not None:
        floor = allocators["C floor"]
        allocators["floor+builtin"] = _builtin(lib, "ump_cupy_allocator", (floor, raise_oom))
        allocators["ump no builtin"] = CFA(UMP_CUPY_CURRENT_STREAM, um, uf, lib).malloc
        for name, mod in (("cupy", "cupy.cuda.stream"), ("backends", "cupy_backends.cuda.stream")):
            fn = _capi_function(mod, "get_current_stream_ptr")
            if fn:
                # One C function pointer in the trivial library: measured one at a time below.
                allocators[f"floor+stream({name})"] = (fn, CFA(0, _addr(triv.triv_malloc_stream), _addr(triv.triv_free), triv).malloc)
        loops = {"C pair param=0": 0, "C pair current": UMP_CUPY_CURRENT_STREAM}
    sizes = [int(s) for s in args.sizes.split(",")]
    names = list(allocators) + list(loops)
    res = {(a, s): [] for a in names for s in sizes}
    alloc = cp.cuda.memory.alloc
    for r in range(args.rounds):
        for name, fn in allocators.items():
            if isinstance(fn, tuple):
                triv.triv_set(fn[0])
                fn = fn[1]
            cp.cuda.set_allocator(fn)
            for s in sizes:
                for _ in range(1000):
                    m = alloc(s)
                    del m
                t = time.perf_counter()
                for _ in range(args.n):
                    m = alloc(s)
                    del m
                res[(name, s)].append((time.perf_counter() - t) / args.n * 1e9)
        for name, param in loops.items():
            for s in sizes:
                triv.triv_loop(um, uf, param, s, 1000)
                res[(name, s)].append(triv.triv_loop(um, uf, param, s, args.n))
        print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    cp.cuda.set_allocator(direct)
    print(f"{'size':>9}  " + "  ".join(f"{a:>14}" for a in names))
    for s in sizes:
        med = {a: statistics.median(res[(a, s)]) for a in names}
        print(f"{s:>9}  " + "  ".join(f"{med[a]:>11.0f} ns" for a in names))
    print("ratios to CuPy's pool (medians):")
    for s in sizes:
        med = {a: statistics.median(res[(a, s)]) for a in names}
        pool = med["cupy pool"]
        print(f"{s:>9}  " + "  ".join(f"{a} {med[a] / pool:.3f}" for a in ("ump direct", "ump bound", "ump python")))
    print("(C pair columns: ump_cupy_malloc+ump_cupy_free from a C loop, no CuPy objects)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
