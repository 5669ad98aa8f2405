"""The CuPy staging fallback's switch on the CPU, with a stand-in CuPy: ``cupy.asarray``,
``cupy.asanyarray`` and ``cupy.array`` (and ``cupy._creation.from_data``'s, which CuPy's
``frombuffer`` family calls) default to ``blocking=True`` exactly while a pinned-memory
allocator other than CuPy's own is set (see ``ump_alloc._cupy_staging``; the GPU check is
``cupy_staging_fallback``)."""

import types

from ump_alloc import _cupy_staging


def _stand_in_cupy():
    calls = []

    class PinnedMemoryPool:
        def malloc(self, n):
            return ("pool", n)

    pool = PinnedMemoryPool()
    functions = {n: (lambda n: lambda a, **kw: (n, kw))(n) for n in _cupy_staging.NAMES}
    from_data = types.SimpleNamespace(**functions)
    cupy = types.SimpleNamespace(
        cuda=types.SimpleNamespace(
            set_pinned_memory_allocator=lambda a=None: calls.append(("set", a)),
            PinnedMemoryPool=PinnedMemoryPool,
        ),
        get_default_pinned_memory_pool=lambda: pool,
        _creation=types.SimpleNamespace(from_data=from_data),
        **functions,
    )
    return cupy, pool, calls, dict(functions)


def test_blocking_only_while_a_foreign_allocator_is_set():
    cupy, pool, calls, originals = _stand_in_cupy()
    _cupy_staging.install(cupy)
    try:
        assert cupy.asarray("x") == ("asarray", {}) and cupy.asarray is originals["asarray"]
        failing = lambda n: None  # noqa: E731
        cupy.cuda.set_pinned_memory_allocator(failing)
        assert calls[-1] == ("set", failing), "the allocator reaches CuPy as given"
        assert _cupy_staging.blocking()
        for name in _cupy_staging.NAMES:
            assert getattr(cupy, name)("x") == (name, {"blocking": True}), name
            assert getattr(cupy._creation.from_data, name)("x") == (name, {"blocking": True}), name
        assert cupy.array("x", order="F") == ("array", {"order": "F", "blocking": True})
        assert cupy.asarray("x", blocking=False) == ("asarray", {"blocking": False}), "the caller's own"
        cupy.cuda.set_pinned_memory_allocator(pool.malloc)  # CuPy's pool back
        assert not _cupy_staging.blocking() and cupy.asarray("x") == ("asarray", {})
        cupy.cuda.set_pinned_memory_allocator(failing)
        cupy.cuda.set_pinned_memory_allocator(None)  # CuPy's plain cudaHostAlloc raises on failure
        assert not _cupy_staging.blocking()
        cupy.cuda.set_pinned_memory_allocator(cupy.cuda.PinnedMemoryPool().malloc)  # another pool
        assert not _cupy_staging.blocking()
        cupy.cuda.set_pinned_memory_allocator(failing)
        assert cupy.asarray("x") == ("asarray", {"blocking": True})
    finally:
        _cupy_staging.uninstall()
    for name, fn in originals.items():
        assert getattr(cupy, name) is fn and getattr(cupy._creation.from_data, name) is fn, name
    assert cupy.cuda.set_pinned_memory_allocator(None) is None and calls[-1] == ("set", None)
    assert not _cupy_staging.blocking()


def test_other_wrappers_stack_in_any_order():
    """A wrapper put on top of ours (the zero-copy asarray) survives our switch going off, and
    our uninstall leaves it in place."""
    cupy, pool, calls, originals = _stand_in_cupy()
    _cupy_staging.install(cupy)
    try:
        cupy.cuda.set_pinned_memory_allocator(lambda n: None)
        ours = cupy.asarray

        def zero_copy(a, **kw):
            return ("zero copy", ours(a, **kw))

        cupy.asarray = zero_copy
        assert cupy.asarray("x") == ("zero copy", ("asarray", {"blocking": True}))
        cupy.cuda.set_pinned_memory_allocator(None)
        assert cupy.asarray is zero_copy and cupy.asarray("x") == ("zero copy", ("asarray", {}))
    finally:
        _cupy_staging.uninstall()
    assert cupy.asarray is zero_copy, "uninstall leaves another's wrapper where it is"
    assert cupy.array is originals["array"]
