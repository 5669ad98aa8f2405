"""Real NumPy workloads on ump-alloc: alignment, contents and handles() checked throughout."""

import threading

import numpy as np
import pytest

from conftest import rand_bytes


def assert_ours(a, ump):
    base = a if a.base is None else a.base
    assert ump.handles(a), "array not allocated by ump-alloc"
    if base.nbytes:
        assert base.ctypes.data % ump.block_alignment(base.nbytes) == 0
        ident = ump.identify(base)
        assert ident.ours and ident.base == base.ctypes.data


def test_default_arrays_are_not_ours():
    import ump_alloc

    a = np.arange(10)
    assert not ump_alloc.handles(a)
    assert not ump_alloc.identify(a).ours


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.float32, np.float64, np.complex128])
def test_creation(ump, dtype):
    rng = np.random.default_rng(1)
    for n in [1, 7, 100, 4096, 100_003, 1_000_000]:
        z = np.zeros(n, dtype)
        assert not z.any()
        assert_ours(z, ump)
        o = np.ones(n, dtype)
        assert (o == 1).all()
        assert_ours(o, ump)
        f = np.full(n, 3, dtype)
        assert (f == 3).all()
        e = np.empty(n, dtype)
        assert_ours(e, ump)
        r = rng.integers(0, 100, n).astype(dtype)
        assert_ours(r, ump)
        assert np.array_equal(r.copy(), r)


def test_zeros_after_dirty_reuse_are_zero(ump):
    # calloc must zero memory that a freed array left dirty.
    for n in [100, 5000, 300_000, 5_000_000]:
        a = np.full(n, 0xAB, np.uint8)
        del a
        z = np.zeros(n, np.uint8)
        assert not z.any(), n
        assert_ours(z, ump)


def test_ufuncs_and_reductions(ump):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 400))
    y = rng.standard_normal((300, 400))
    got = np.sin(x) * np.exp(-(y**2))
    assert_ours(got, ump)
    expect = np.array([np.sin(a) * np.exp(-(b**2)) for a, b in zip(x.ravel()[:1000], y.ravel()[:1000])])
    np.testing.assert_allclose(got.ravel()[:1000], expect)
    np.testing.assert_allclose(got.sum(axis=0), np.add.reduce(got, axis=0))
    m = x @ y.T
    assert m.shape == (300, 300)
    assert_ours(m, ump)
    np.testing.assert_allclose(m[5, 7], np.dot(x[5], y[7]))
    s = np.sort(x, axis=1)
    assert (np.diff(s, axis=1) >= 0).all()
    u, c = np.unique(rng.integers(0, 50, 10_000), return_counts=True)
    assert c.sum() == 10_000


def test_resize_and_realloc_keep_contents(ump):
    data = rand_bytes(1000, seed=3)
    a = data.copy()
    keep = 1000  # bytes that must survive every resize so far
    for n in [2000, 10_000, 400_000, 3_000_000, 50, 1_000_000]:
        a.resize(n, refcheck=False)  # realloc in place or moved
        keep = min(keep, n)
        assert np.array_equal(a[:keep], data[:keep])
        assert a.ctypes.data % ump.block_alignment(a.nbytes) == 0
        assert_ours(a, ump)
    r = np.resize(data, 5000)
    assert np.array_equal(r[:1000], data) and np.array_equal(r[1000:2000], data)
    grown = np.append(np.arange(10), np.arange(10**6))
    assert grown[10 + 999_999] == 999_999
    it = np.fromiter((i * i for i in range(100_000)), dtype=np.int64)  # grows by realloc
    assert it[99_999] == 99_999**2
    assert_ours(it, ump)


def test_growing_large_arrays_copies_nothing(ump):
    """ndarray.resize (realloc) of a large array grows and shrinks it in place, or moves its
    pages, never copying a byte: ump_alloc.stats()["realloc"] says so and the contents survive
    (checked at random places, so that no large temporary takes the room the array grows
    into). The first step, out of a small block, copies: the counter must see that one."""
    rng = np.random.default_rng(12)
    a = rng.integers(0, 2**62, size=1 << 10)  # 8 KiB: a slab block
    head = a.copy()
    before = ump.stats()["realloc"]
    a.resize(16 << 20, refcheck=False)  # 128 MiB: the slab block cannot grow, so it copies
    mid = ump.stats()["realloc"]
    assert mid["copied"] == before["copied"] + 1, (before, mid)
    assert mid["copied_bytes"] - before["copied_bytes"] == head.nbytes, (before, mid)
    assert np.array_equal(a[: head.size], head)
    parts = [(0, head.size, None), (head.size, a.size, 1)]  # (start, end, value or None: head)
    a[head.size :] = 1
    for step, n in enumerate([24 << 20, 40 << 20, 33 << 20, 64 << 20, 20 << 20, 48 << 20], start=2):
        old = a.size
        a.resize(n, refcheck=False)
        parts = [(lo, min(hi, n), v) for lo, hi, v in parts if lo < n]  # a shrink cuts them
        if n > old:
            a[old:] = step  # fills in place: no temporary
            parts.append((old, n, step))
        assert_ours(a, ump)
        for lo, hi, v in parts:
            idx = rng.integers(lo, hi, size=200)
            want = head[idx] if v is None else np.full(idx.size, v)
            assert np.array_equal(a[idx], want), (n, lo, hi)
    after = ump.stats()["realloc"]
    assert after["copied_bytes"] == mid["copied_bytes"], (mid, after)
    assert after["in_place"] >= mid["in_place"] + 6, (mid, after)


def test_concatenate_stack_and_views(ump):
    parts = [np.random.default_rng(i).random(10_000 + i) for i in range(20)]
    c = np.concatenate(parts)
    assert c.size == sum(p.size for p in parts)
    assert np.array_equal(c[: parts[0].size], parts[0])
    assert_ours(c, ump)
    st = np.stack([p[:100] for p in parts])
    assert st.shape == (20, 100)
    v = c[5:-5:3]
    assert ump.handles(v)
    assert ump.identify(v).ours and ump.identify(v).base == c.ctypes.data


def test_large_arrays(ump):
    n = 256 * 2**20
    a = np.empty(n, np.uint8)
    assert_ours(a, ump)
    a[::4096] = 7
    a[-1] = 9
    assert a[::4096].sum() == 7 * len(range(0, n, 4096))
    assert a[-1] == 9
    b = np.zeros((8192, 8192), np.float32)  # 256 MiB
    assert not b[::512, ::512].any()
    assert_ours(b, ump)
    del a, b


def test_structured_strings_objects(ump):
    s = np.array(["a", "bb", "ccc" * 100])
    assert s[2] == "ccc" * 100
    rec = np.zeros(10, dtype=[("x", "f8"), ("y", "i4", (3,))])
    rec["y"][4] = [1, 2, 3]
    assert rec["y"][4].tolist() == [1, 2, 3]
    o = np.array([{"k": i} for i in range(1000)], dtype=object)
    assert o[999]["k"] == 999
    assert_ours(o, ump)


def test_threads(ump):
    errors = []

    def work(seed):
        try:
            rng = np.random.default_rng(seed)
            for _ in range(200):
                n = int(rng.integers(1, 50_000))
                x = rng.random(n)
                y = np.sqrt(x) * 2
                assert np.allclose(y / 2, np.sqrt(x))
                assert ump.handles(y), "thread arrays come from ump-alloc"
                assert y.ctypes.data % ump.block_alignment(y.nbytes) == 0
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_enabled_restores_default():
    import ump_alloc

    with ump_alloc.enabled(cupy=False, torch=False):
        inside = np.arange(100)
        assert ump_alloc.handles(inside)
    outside = np.arange(100)
    assert not ump_alloc.handles(outside)
    assert int(inside.sum()) == 4950  # freed later through ump-alloc, still valid
    del inside
