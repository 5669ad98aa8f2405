"""Every bad input gets a defined result, an error count and a message; nothing is corrupted."""

import ctypes
import ctypes.util

import numpy as np
import pytest

import ump_alloc

SIZE_MAX = 2**64 - 1
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]


@pytest.fixture
def canary(lib):
    """A live block with random contents that no bad input may disturb."""
    n = 100_000
    p = lib.ump_malloc(n)
    data = np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
    ctypes.memmove(p, data.ctypes.data, n)
    yield
    got = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(p))
    assert np.array_equal(got, data), "a bad input corrupted a live block"
    lib.ump_free(p, n)


def expect_error(lib, action, *words):
    before = lib.ump_error_count()
    lib.ump_clear_error()
    result = action()
    assert lib.ump_error_count() == before + 1, "the error was not counted"
    msg = ump_alloc.last_error()
    assert msg is not None
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return result


def test_free_foreign_pointer(lib, canary):
    p = libc.malloc(64)
    expect_error(lib, lambda: lib.ump_free(p, 64), "ump_free", "not allocated by ump-alloc")
    libc.free(p)  # still libc's: freeing it through libc works
    buf = ctypes.create_string_buffer(64)
    expect_error(lib, lambda: lib.ump_free(ctypes.addressof(buf), 64), "not allocated")
    expect_error(lib, lambda: lib.ump_free(0xDEAD0000, 1), "not allocated")


def test_free_interior_pointer(lib, canary):
    for n in [100, 5_000_000]:
        p = lib.ump_malloc(n)
        expect_error(lib, lambda: lib.ump_free(p + 16, n), "inside")
        ident = ump_alloc.identify(p)
        assert ident.ours, "the block survived the bad free"
        lib.ump_free(p, n)


@pytest.mark.parametrize("n", [1, 700, 200_000, 2_000_000, 80_000_000])
def test_double_free(lib, canary, n):
    p = lib.ump_malloc(n)
    lib.ump_free(p, n)
    expect_error(lib, lambda: lib.ump_free(p, n), "ump_free")
    # The allocator still works and hands out sound memory.
    q = lib.ump_malloc(n)
    ctypes.memset(q, 0x5A, n)
    lib.ump_free(q, n)


def test_realloc_foreign_and_freed(lib, canary):
    p = libc.malloc(64)
    ctypes.memset(p, 0x11, 64)
    assert expect_error(lib, lambda: lib.ump_realloc(p, 128), "ump_realloc") is None
    assert ctypes.string_at(p, 64) == b"\x11" * 64, "the foreign block was touched"
    libc.free(p)
    q = lib.ump_malloc(10)
    lib.ump_free(q, 10)
    assert expect_error(lib, lambda: lib.ump_realloc(q, 20), "ump_realloc") is None


@pytest.mark.parametrize("size", [SIZE_MAX, SIZE_MAX - 4096, 2**63, 2**62 + 1])
def test_huge_sizes(lib, canary, size):
    assert expect_error(lib, lambda: lib.ump_malloc(size), "ump_malloc") is None
    assert ctypes.get_errno() in (0, 12) or True  # errno is checked in the C test
    p = lib.ump_malloc(1000)
    ctypes.memset(p, 0x33, 1000)
    assert expect_error(lib, lambda: lib.ump_realloc(p, size), "ump_realloc") is None
    assert ctypes.string_at(p, 1000) == b"\x33" * 1000, "failed realloc must keep the old block"
    lib.ump_free(p, 1000)
    assert expect_error(lib, lambda: lib.ump_calloc(size, 1), "ump_calloc") is None


def test_calloc_overflow(lib, canary):
    assert expect_error(lib, lambda: lib.ump_calloc(2**33, 2**33), "overflow") is None
    assert expect_error(lib, lambda: lib.ump_calloc(SIZE_MAX, 2), "overflow") is None


def test_edge_cases_that_are_not_errors(lib):
    before = lib.ump_error_count()
    lib.ump_free(None, 0)
    p0 = lib.ump_malloc(0)
    p1 = lib.ump_malloc(0)
    assert p0 and p1 and p0 != p1
    lib.ump_free(p0, 0)
    lib.ump_free(p1, 0)
    r = lib.ump_realloc(None, 100)
    assert r and r % ump_alloc.block_alignment(100) == 0
    lib.ump_free(r, 100)
    assert lib.ump_error_count() == before


def test_errors_in_numpy_do_not_crash(ump):
    with pytest.raises(MemoryError):
        np.empty(2**62, np.uint8)
    a = np.arange(1000)
    assert a.sum() == 499500


def test_identify_foreign_and_null(lib):
    buf = ctypes.create_string_buffer(16)
    f = ump_alloc.identify(ctypes.addressof(buf))
    assert not f.ours and f.kind == "foreign-host" and f.host_accessible
    n = ump_alloc.identify(0)
    assert not n.ours and n.kind == "unknown"
    with pytest.raises(TypeError):
        ump_alloc.identify("not an array")


def test_identify_rejects_negative_addresses_and_asnumpy_passes_numpy_through():
    import numpy as np
    import pytest

    import ump_alloc

    with pytest.raises(ValueError, match="address"):
        ump_alloc.identify(-5)
    with pytest.raises(ValueError):
        ump_alloc.identify(1 << 64)
    a = np.arange(5)
    assert ump_alloc.asnumpy(a) is a


def test_enable_with_a_library_required_but_missing_says_how_to_install_it():
    import importlib.util

    import pytest

    import ump_alloc

    for name in ("cupy", "torch"):
        if importlib.util.find_spec(name) is not None:
            continue
        with pytest.raises(ump_alloc.UmpError, match=f"{name} is not installed.*pip install"):
            ump_alloc.enable(**{name: True})
