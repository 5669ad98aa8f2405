"""NumPy's handler without numpy_allocator (issue 23): ump-alloc's own NEP 49 handler, the
numpy_allocator route for those who choose it, and every thread, those made before ump-alloc
was switched on included (NumPy's default handler dispatches)."""

import concurrent.futures
import textwrap

import numpy as np
import pytest

import ump_alloc
from conftest import run_python

try:
    from numpy._core import multiarray as _ma
except ImportError:  # NumPy 1.x
    from numpy.core import multiarray as _ma

# numpy_allocator made unimportable, as on CPython 3.14 or a free-threaded build.
NO_NUMPY_ALLOCATOR = "import sys; sys.modules['numpy_allocator'] = None\n"


def _pool_task(n, seed):
    """Runs on a worker: an array of random data, whether this thread is on ump-alloc, and the
    name of its handler."""
    a = np.random.default_rng(seed).integers(0, 1 << 30, n)
    return a, a.copy(), ump_alloc.is_enabled(), _ma.get_handler_name()


def test_native_route_is_numpys_handler_and_needs_no_numpy_allocator():
    code = NO_NUMPY_ALLOCATOR + textwrap.dedent(
        """
        import numpy as np, ump_alloc
        try:
            from numpy._core import multiarray as ma
        except ImportError:
            from numpy.core import multiarray as ma
        a = np.random.default_rng(0).standard_normal(100_000)
        z = np.zeros(5000)          # calloc
        b = a.copy(); b.resize(300_000, refcheck=False)   # realloc
        assert ump_alloc.handles(a) and ump_alloc.handles(z) and ump_alloc.handles(b)
        assert not z.any() and np.array_equal(b[:100_000], a) and not b[100_000:].any()
        assert ma.get_handler_name() == "ump_alloc" and ma.get_handler_name(a) == "ump_alloc"
        assert ma.get_handler_version(a) == 1
        from ump_alloc import _numpy
        assert _numpy.route() == "native"
        del a, z, b
        assert ump_alloc.stats()["errors"]["total"] == 0
        print("ok")
        """
    )
    r = run_python(code, env={"UMP_ALLOC": "1", "UMP_ALLOC_NO_CUDA": "1"})
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def test_numpy_allocator_route_still_works():
    pytest.importorskip("numpy_allocator")
    code = textwrap.dedent(
        """
        import numpy as np, numpy_allocator, ump_alloc
        from ump_alloc import _numpy
        a = np.arange(100_000)
        assert ump_alloc.handles(a)
        assert _numpy.route() == "numpy_allocator"
        assert numpy_allocator.get_handler() is _numpy.handler_class().handler()
        assert _numpy.handler_class().handles(a)
        with ump_alloc.enabled(threads=False):
            b = np.ones(10)
        assert ump_alloc.handles(b)
        print("ok")
        """
    )
    env = {"UMP_ALLOC": "1", "UMP_ALLOC_NO_CUDA": "1", "UMP_ALLOC_NUMPY_ROUTE": "numpy_allocator"}
    r = run_python(code, env=env)
    assert r.stdout.strip() == "ok", r.stdout + r.stderr
    info = run_python("import sys; from ump_alloc.__main__ import main; sys.exit(main(['info']))", env=env)
    assert "NumPy handler: through the numpy_allocator package" in info.stdout, info.stdout


def test_numpy_allocator_route_without_the_package_says_what_to_install():
    env = {"UMP_ALLOC": "1", "UMP_ALLOC_NO_CUDA": "1", "UMP_ALLOC_NUMPY_ROUTE": "numpy_allocator"}
    r = run_python(NO_NUMPY_ALLOCATOR + "import numpy", env=env, check=False)
    assert r.returncode != 0
    assert "ModuleNotFoundError" not in r.stderr, r.stderr
    assert "pip install numpy_allocator" in r.stderr and "unset UMP_ALLOC_NUMPY_ROUTE" in r.stderr, r.stderr
    # info names the route and that the package is missing.
    code = NO_NUMPY_ALLOCATOR + "import sys; from ump_alloc.__main__ import main; sys.exit(main(['info']))"
    info = run_python(code, env={"UMP_ALLOC_NO_CUDA": "1", "UMP_ALLOC_NUMPY_ROUTE": "numpy_allocator"}, check=False)
    assert "NOT installed" in info.stdout, info.stdout + info.stderr
    assert info.returncode == 2 and "pip install numpy_allocator" in info.stderr, info.stdout + info.stderr


def test_a_bad_route_is_a_configuration_error():
    r = run_python("import numpy", env={"UMP_ALLOC": "1", "UMP_ALLOC_NUMPY_ROUTE": "numpy-allocator"}, check=False)
    assert r.returncode != 0 and "UMP_ALLOC_NUMPY_ROUTE" in r.stderr and "expected native" in r.stderr, r.stderr


def test_handles_follows_the_memory():
    with ump_alloc.enabled(cupy=False, torch=False):
        a = np.arange(1000.0)
    d = np.arange(1000.0)
    assert ump_alloc.handles(a) and ump_alloc.handles(a[10:20]) and ump_alloc.handles(a.reshape(10, 100).T)
    assert not ump_alloc.handles(d) and not ump_alloc.handles(d[::2])
    assert not ump_alloc.handles(np.frombuffer(a.tobytes(), dtype=a.dtype))  # another object's memory
    with pytest.raises(TypeError):
        ump_alloc.handles([1, 2])


def test_a_thread_pool_made_before_enable_allocates_from_ump_alloc():
    """The pool's worker exists before enable(): it starts from an empty context, on NumPy's
    default handler, which must now allocate from ump-alloc; after disable() it allocates from
    NumPy again, and every array, whoever made it, is freed and resized where it came from."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        before, before_copy, on, _ = pool.submit(_pool_task, 50_000, 1).result()
        assert not on and not ump_alloc.handles(before)
        errors = ump_alloc.error_count()
        with ump_alloc.enabled(cupy=False, torch=False):
            during, during_copy, on, name = pool.submit(_pool_task, 50_000, 2).result()
            # NumPy's default handler, dispatching: it keeps its name (NumPy's own suite asks
            # for it), and the memory is ump-alloc's.
            assert on and name == "default_allocator"
            assert ump_alloc.handles(during), "a thread made before enable() stayed on NumPy's allocator"
            # A block NumPy made before, resized now: stays NumPy's, contents kept.
            pool.submit(before.resize, 200_000, refcheck=False).result()
            assert not ump_alloc.handles(before) and np.array_equal(before[:50_000], before_copy)
        after, _, on, _ = pool.submit(_pool_task, 1000, 3).result()
        assert not on and not ump_alloc.handles(after)
        # Ours, resized and freed after disable(): by ump-alloc, contents kept.
        pool.submit(during.resize, 400_000, refcheck=False).result()
        assert ump_alloc.handles(during) and np.array_equal(during[:50_000], during_copy)
        del before, during
    assert ump_alloc.error_count() == errors, ump_alloc.last_error()


def test_the_default_handler_keeps_its_name_and_serves_ump_alloc():
    """NumPy's own tests (``test_mem_policy.py``: ``test_default_policy_singleton``,
    ``test_context_locality``) set the default handler and ask its name: it must still read
    ``default_allocator`` while the dispatch stands in it, and a fresh context (what a new
    thread starts from) allocates from ump-alloc through it."""
    import contextvars

    fresh = contextvars.Context()
    assert fresh.run(_ma.get_handler_name) == "default_allocator"
    with ump_alloc.enabled(cupy=False, torch=False):
        assert _ma.get_handler_name() == "ump_alloc"
        name, a = fresh.run(lambda: (_ma.get_handler_name(), np.arange(100_000.0)))
        assert name == "default_allocator" and ump_alloc.handles(a), name
        assert _ma.get_handler_name(a) == "default_allocator"
    del a


def test_threads_false_leaves_other_threads_alone():
    """The control: without the dispatch (threads=False) a thread made before enable() stays
    on NumPy's allocator, the violation the test above guards against."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(int).result()  # the worker exists
        with ump_alloc.enabled(cupy=False, torch=False, threads=False):
            mine = np.ones(1000)
            theirs, _, on, _ = pool.submit(_pool_task, 1000, 4).result()
        assert ump_alloc.handles(mine)
        assert not on and not ump_alloc.handles(theirs)


def test_under_UMP_ALLOC_a_pool_made_before_import_numpy_is_on_ump_alloc():
    code = NO_NUMPY_ALLOCATOR + textwrap.dedent(
        """
        import concurrent.futures, threading, sys
        pool = concurrent.futures.ThreadPoolExecutor(4)
        list(pool.map(lambda _: threading.get_ident(), range(16)))   # the workers exist
        assert "numpy" not in sys.modules
        import numpy as np, ump_alloc

        def work(seed):
            a = np.random.default_rng(seed).standard_normal(20_000)
            return ump_alloc.handles(a), ump_alloc.handles(a * 2), float(a.sum())

        out = list(pool.map(work, range(16)))
        assert all(h1 and h2 for h1, h2, _ in out), out
        expect = [float(np.random.default_rng(s).standard_normal(20_000).sum()) for s in range(16)]
        assert [s for _, _, s in out] == expect
        # A thread started later, outside threading (as C code would): also on ump-alloc.
        import _thread, queue
        q = queue.Queue()
        _thread.start_new_thread(lambda: q.put(ump_alloc.handles(np.ones(100))), ())
        assert q.get(timeout=60)
        assert ump_alloc.stats()["errors"]["total"] == 0
        print("ok")
        """
    )
    r = run_python(code, env={"UMP_ALLOC": "1", "UMP_ALLOC_NO_CUDA": "1"})
    assert r.stdout.strip() == "ok", r.stdout + r.stderr


def test_info_names_the_route_and_the_threads():
    r = run_python(
        NO_NUMPY_ALLOCATOR + "import sys; from ump_alloc.__main__ import main; sys.exit(main(['info']))",
        env={"UMP_ALLOC_NO_CUDA": "1"},
    )
    assert "NumPy handler: ump-alloc's own (NEP 49" in r.stdout, r.stdout
    assert "threads: all, those started before enabling too" in r.stdout, r.stdout


@pytest.mark.parametrize("route", ["native", "numpy_allocator"])
def test_allocating_block_works_on_both_routes(route):
    """ump-alloc's own buffers (PyTorch's .cpu() into the host side) come from ump-alloc inside
    ``_numpy.allocating()`` whichever route is configured, and the thread's handler is back
    after it."""
    if route == "numpy_allocator":
        pytest.importorskip("numpy_allocator")
    code = (NO_NUMPY_ALLOCATOR if route == "native" else "") + textwrap.dedent(
        """
        import numpy as np, ump_alloc
        from ump_alloc import _config, _numpy
        _config.init()
        with _numpy.allocating():
            a = np.empty(1 << 20, np.uint8)
        b = np.empty(10)
        print(ump_alloc.handles(a), ump_alloc.handles(b), _numpy.route())
        """
    )
    r = run_python(code, env={"UMP_ALLOC_NO_CUDA": "1", "UMP_ALLOC_NUMPY_ROUTE": route})
    assert r.stdout.split() == ["True", "False", route], r.stdout + r.stderr
