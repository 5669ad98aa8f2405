"""The CuPy fast path's builtins (``ump_cupy_allocator_direct``, ``ump_cupy_allocator``) on a
machine without a GPU or CuPy: CuPy's pieces are stand-ins (Python classes for
``CFunctionAllocatorMemory``/``MemoryPointer``, ctypes callbacks for CuPy's C functions), so the
builtins' own work is checked: the objects they make and pass, the device and stream they read,
the failure path (``ump_cupy_malloc`` fails without a GPU: the builtin must call ``raise_oom``
and drop the half-made object), errors raised by CuPy's pieces, and no reference leaks. Each
case runs in a fresh interpreter (the C functions are handed to the library once per process).
"""

from conftest import GPU, run_python

import pytest

_SETUP = r"""
import ctypes, gc, sys, weakref
from ump_alloc import _cupy, _lib

lib = _lib.lib()
api = ctypes.pythonapi
addr = _cupy._function_address
calls = {"stream": 0, "device": 0, "oom": []}
state = {"device": 0}

def stream_fn(_skip):
    calls["stream"] += 1
    return 0

def device_fn(_skip):
    calls["device"] += 1
    return state["device"]

STREAM = ctypes.PYFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)(stream_fn)
DEVICE = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_int)(device_fn)
rc = lib.ump_cupy_fast_path_init(
    ctypes.c_void_p(addr(api.PyObject_CallFunctionObjArgs)), ctypes.c_void_p(addr(api.Py_DecRef)),
    ctypes.c_void_p(addr(api.PyTuple_GetItem)), ctypes.c_void_p(ctypes.cast(STREAM, ctypes.c_void_p).value),
    ctypes.c_void_p(addr(api.PyLong_FromLong)), ctypes.c_void_p(ctypes.cast(DEVICE, ctypes.c_void_p).value))
assert rc == _lib.OK, _lib.last_error()
MALLOC = addr(lib.ump_cupy_malloc)
FREE = addr(lib.ump_cupy_free)
C_MALLOC = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)(MALLOC)
alive = []

class Mem:  # CuPy's CFunctionAllocatorMemory: calls malloc for size > 0
    def __init__(self, size, param, malloc, free, device_id):
        self.args = (size, param, malloc, free, device_id)
        self.ptr = C_MALLOC(param, size, device_id) or 0 if size > 0 else 0
        alive.append(weakref.ref(self))

class Ptr:  # CuPy's MemoryPointer
    def __init__(self, mem, offset):
        self.mem, self.offset = mem, offset
        alive.append(weakref.ref(self))

class Oom(Exception):
    pass

def raise_oom(size):
    calls["oom"].append(size)
    raise Oom(f"{size}: {_lib.last_error()}")

P = _cupy.UMP_CUPY_CURRENT_STREAM
direct = _cupy._builtin(b"ump_cupy_allocator_direct", (raise_oom, Mem, Ptr, P, MALLOC, FREE, 0))

def all_dead():
    gc.collect()
    return not any(r() is not None for r in alive)
"""


def _run(body):
    r = run_python(_SETUP + body, env={"UMP_ALLOC_MODE": "host"})
    assert r.stdout.strip().endswith("ok"), r.stdout + r.stderr


@pytest.mark.skipif(GPU, reason="the failure path needs a machine where ump_cupy_malloc fails (no GPU)")
def test_direct_builtin_makes_cupys_objects_and_raises_on_failure():
    _run(r"""
assert direct.__name__ == "ump_cupy_allocator_direct"
p = direct(0)  # size 0: CuPy makes no call to malloc
assert type(p) is Ptr and p.offset == 0 and type(p.mem) is Mem
assert p.mem.args == (0, P, MALLOC, FREE, 0), p.mem.args
assert calls == {"stream": 0, "device": 1, "oom": []}, calls
state["device"] = 3
assert direct(0).mem.args[4] == 3  # CuPy's current device, read per call
state["device"] = 0
del p
assert all_dead()
# ump_cupy_malloc fails here (no GPU): the builtin drops the Mem and calls raise_oom(size).
try:
    direct(4096)
except Oom as e:
    assert "4096" in str(e) and "ump_cupy_malloc" in str(e), str(e)
else:
    raise AssertionError("no OutOfMemoryError from a failed allocation")
assert calls["oom"] == [4096] and calls["stream"] == 1, calls
assert all_dead(), "the failed allocation's Mem leaked"
# The failure flag is reset per call: a later size-0 allocation succeeds.
assert type(direct(0)) is Ptr and calls["oom"] == [4096]
# No leaks over many calls, success and failure alike.
before = sys.getrefcount(Mem), sys.getrefcount(Ptr), sys.getrefcount(raise_oom)
for _ in range(2000):
    direct(0)
    try:
        direct(100)
    except Oom:
        pass
assert (sys.getrefcount(Mem), sys.getrefcount(Ptr), sys.getrefcount(raise_oom)) == before
assert all_dead() and len(calls["oom"]) == 2001
print("ok")
""")


def test_direct_builtin_passes_cupys_errors_on():
    _run(r"""
class Boom(Exception):
    pass

def bad_mem(*a):
    raise Boom("mem")

def bad_ptr(mem, off):
    alive.append(weakref.ref(mem))
    raise Boom("ptr")

for t, what in (((raise_oom, bad_mem, Ptr, P, MALLOC, FREE, 0), "mem"), ((raise_oom, Mem, bad_ptr, P, MALLOC, FREE, 0), "ptr")):
    b = _cupy._builtin(b"ump_cupy_allocator_direct", t)
    try:
        b(0)
    except Boom as e:
        assert str(e) == what
    else:
        raise AssertionError(what)
assert all_dead() and calls["oom"] == []
# CuPy's device function failing (-1; here without a Python exception): an error, never an object.
state["device"] = -1
try:
    direct(0)
except SystemError:
    pass
else:
    raise AssertionError("a failed device read gave an object")
state["device"] = 0
# A tuple too short: IndexError, no crash.
try:
    _cupy._builtin(b"ump_cupy_allocator_direct", (raise_oom, Mem))(0)
except IndexError:
    pass
else:
    raise AssertionError("short tuple")
print("ok")
""")


@pytest.mark.skipif(GPU, reason="the failure path needs a machine where ump_cupy_malloc fails (no GPU)")
def test_bound_builtin_passes_through_and_raises_on_failure():
    _run(r"""
def malloc(size):  # CFunctionAllocator.malloc
    return Ptr(Mem(size, P, MALLOC, FREE, 0), 0)

bound = _cupy._builtin(b"ump_cupy_allocator", (malloc, raise_oom))
assert bound.__name__ == "ump_cupy_allocator"
p = bound(0)
assert type(p) is Ptr and p.mem.args[0] == 0 and calls["oom"] == []
del p
try:
    bound(512)
except Oom:
    pass
else:
    raise AssertionError("no error from a failed allocation")
assert calls["oom"] == [512] and all_dead()
assert type(bound(0)) is Ptr and calls["oom"] == [512]
print("ok")
""")
