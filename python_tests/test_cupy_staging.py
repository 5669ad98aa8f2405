"""The CuPy staging fallback's switch on the CPU, with a stand-in CuPy: ``cupy.asarray`` and
``cupy.array`` default to ``blocking=True`` exactly while a pinned-memory allocator other than
CuPy's own is set (see ``ump_alloc._cupy_staging``; the GPU check is ``cupy_staging_fallback``)."""

import types

from ump_alloc import _cupy_staging


def _stand_in_cupy():
    calls = []
    pool = types.SimpleNamespace(malloc=lambda n: ("pool", n))
    cupy = types.SimpleNamespace(
        cuda=types.SimpleNamespace(set_pinned_memory_allocator=lambda a=None: calls.append(("set", a))),
        get_default_pinned_memory_pool=lambda: pool,
        asarray=lambda a, **kw: ("asarray", kw),
        array=lambda a, **kw: ("array", kw),
    )
    return cupy, pool, calls


def test_blocking_only_while_a_foreign_allocator_is_set():
    cupy, pool, calls = _stand_in_cupy()
    original = cupy.asarray
    _cupy_staging.install(cupy)
    try:
        assert cupy.asarray("x") == ("asarray", {})
        failing = lambda n: None  # noqa: E731
        cupy.cuda.set_pinned_memory_allocator(failing)
        assert calls[-1] == ("set", failing), "the allocator reaches CuPy as given"
        assert _cupy_staging.blocking()
        assert cupy.asarray("x") == ("asarray", {"blocking": True})
        assert cupy.array("x", order="F") == ("array", {"order": "F", "blocking": True})
        assert cupy.asarray("x", blocking=False) == ("asarray", {"blocking": False}), "the caller's own"
        cupy.cuda.set_pinned_memory_allocator(failing)  # set twice: wrapped once
        assert cupy.asarray("x") == ("asarray", {"blocking": True})
        cupy.cuda.set_pinned_memory_allocator(pool.malloc)  # CuPy's pool back
        assert not _cupy_staging.blocking() and cupy.asarray is original
        cupy.cuda.set_pinned_memory_allocator(failing)
        cupy.cuda.set_pinned_memory_allocator(None)  # CuPy's plain cudaHostAlloc raises on failure
        assert not _cupy_staging.blocking() and cupy.asarray is original
        cupy.cuda.set_pinned_memory_allocator(failing)
    finally:
        _cupy_staging.uninstall()
    assert cupy.asarray is original, "uninstall gives CuPy its functions back"
    assert cupy.cuda.set_pinned_memory_allocator(None) is None and calls[-1] == ("set", None)
    assert not _cupy_staging.blocking()
