"""The Python API's contracts (issue 13): enable()/disable() nesting, enable(limit=...),
enable(children=True) for spawn/forkserver children, handles() before and after enable(), the
package namespace, and the public allocator objects of ump_alloc.allocators."""

import os
import textwrap

import numpy as np
import pytest
from conftest import run_python

import ump_alloc
from ump_alloc import UmpError, _enable


def test_enable_disable_nest():
    assert not ump_alloc.is_enabled()
    ump_alloc.enable(cupy=False, torch=False)
    ump_alloc.enable(cupy=False, torch=False)
    ump_alloc.disable()
    assert ump_alloc.is_enabled(), "the outer enable() must still hold after one disable()"
    a = np.ones(1000)
    assert ump_alloc.handles(a)
    ump_alloc.disable()
    assert not ump_alloc.is_enabled()
    assert not ump_alloc.handles(np.ones(1000))
    assert ump_alloc.handles(a), "an array made while enabled stays ours after disable()"
    with pytest.raises(UmpError, match="without a matching enable"):
        ump_alloc.disable()


def test_enabled_context_nests_inside_enable():
    ump_alloc.enable(cupy=False, torch=False)
    try:
        with ump_alloc.enabled(cupy=False, torch=False):
            assert ump_alloc.is_enabled()
        assert ump_alloc.is_enabled(), "leaving the inner block must not switch off the outer enable()"
    finally:
        ump_alloc.disable()
    assert not ump_alloc.is_enabled()


def test_autoload_is_one_frame():
    """UMP_ALLOC=1: one disable() undoes what the import hooks switched on; a second raises."""
    r = run_python(
        textwrap.dedent(
            """
            import numpy as np, ump_alloc
            assert ump_alloc.is_enabled()
            ump_alloc.enable(cupy=False, torch=False)   # the program's own, above the autoload
            ump_alloc.disable()
            assert ump_alloc.is_enabled()
            ump_alloc.disable()
            assert not ump_alloc.is_enabled()
            try:
                ump_alloc.disable()
            except ump_alloc.UmpError as e:
                print("refused:", e)
            """
        ),
        env={"UMP_ALLOC": "1"},
    )
    assert "refused: disable() without a matching enable()" in r.stdout, r.stdout


@pytest.mark.parametrize("when", ["before", "after"])
def test_handles_same_before_and_after_enable(when):
    def check():
        for bad in ([1, 2], 5, None, memoryview(b"xy")):
            with pytest.raises(TypeError, match="ndarray"):
                ump_alloc.handles(bad)
        assert ump_alloc.handles(np.arange(3)) is (when == "after")

    if when == "before":
        check()
    else:
        with ump_alloc.enabled(cupy=False, torch=False):
            check()


def test_namespace_is_the_public_api():
    public = {n for n in dir(ump_alloc) if not n.startswith("_")}
    submodules = {"numba", "dask", "allocators", "bench"}  # loaded on demand
    assert public - submodules <= set(ump_alloc.__all__), sorted(public - set(ump_alloc.__all__) - submodules)
    for n in ump_alloc.__all__:
        assert hasattr(ump_alloc, n), n


def test_enable_limit():
    code = textwrap.dedent(
        """
        import numpy as np, ump_alloc
        ump_alloc.enable(cupy=False, torch=False, limit=LIMIT)
        a = np.ones(8 << 20, dtype=np.uint8)          # 8 MiB: within any limit here
        try:
            b = np.ones(512 << 20, dtype=np.uint8)   # 512 MiB
            print("big: ok")
        except MemoryError:
            print("big: MemoryError")
        try:
            ump_alloc.enable(cupy=False, torch=False, limit="1T")
        except ump_alloc.UmpError as e:
            print("relimit:", e)
        """
    )
    r = run_python(code.replace("LIMIT", '"256M"'))
    assert "big: MemoryError" in r.stdout, r.stdout
    assert "relimit: " in r.stdout and "already 268435456 bytes" in r.stdout, r.stdout
    r = run_python(code.replace("LIMIT", "256 << 20"))
    assert "big: MemoryError" in r.stdout, r.stdout
    # Control: no limit, and the argument overrides the environment's.
    r = run_python(code.replace("LIMIT", '"none"'), env={"UMP_ALLOC_LIMIT": "128M"})
    assert "big: ok" in r.stdout, r.stdout


@pytest.mark.parametrize("bad", [0, "0", "lots", -1, 1.5, True])
def test_enable_limit_refuses_bad_values(bad):
    r = run_python(
        f"import ump_alloc\ntry:\n    ump_alloc.enable(cupy=False, torch=False, limit={bad!r})\n"
        "except (ump_alloc.UmpError, TypeError) as e:\n    print(type(e).__name__, e)\n"
        "print('enabled:', ump_alloc.is_enabled())"
    )
    assert ("UmpError" in r.stdout or "TypeError" in r.stdout) and "enabled: False" in r.stdout, r.stdout


_CHILD_MODULE = """
import os


def report(q):
    import numpy as np

    import ump_alloc

    q.put((ump_alloc.is_enabled(), ump_alloc.handles(np.ones(100)), os.environ.get("UMP_ALLOC_CUPY_ZERO_COPY")))


def run(method):
    import multiprocessing as mp

    ctx = mp.get_context(method)
    q = ctx.Queue()
    p = ctx.Process(target=report, args=(q,))
    p.start()
    out = q.get(timeout=120)
    p.join(60)
    return out
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_children_reach_spawn_and_forkserver(method, tmp_path):
    if not _enable.pth_installed():
        pytest.skip("ump_alloc.pth is not in site-packages (run through scripts/test.sh)")
    (tmp_path / "childmod.py").write_text(_CHILD_MODULE)
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    script = textwrap.dedent(
        f"""
        import os, warnings
        import ump_alloc, childmod
        warnings.simplefilter("error")
        EARLY
        with ump_alloc.enabled(cupy=False, torch=False, KW):
            print("child:", childmod.run({method!r}))
        print("after:", "UMP_ALLOC" in os.environ, "UMP_ALLOC_CUPY_ZERO_COPY" in os.environ)
        """
    )
    r = run_python(script.replace("EARLY", "").replace("KW", "children=True, cupy_zero_copy=False"), env=env)
    assert "child: (True, True, '0')" in r.stdout, r.stdout + r.stderr
    assert "after: False False" in r.stdout, "disable() must put the variables back"
    # Control: enable() alone does not reach a child that starts a new interpreter.
    r = run_python(script.replace("EARLY", "").replace(", KW", ""), env=env)
    assert "child: (False, False, None)" in r.stdout, r.stdout + r.stderr
    if method == "forkserver":
        # A forkserver started before enable(children=True) keeps its environment: a warning.
        early = f"childmod.run({method!r})"
        r = run_python(script.replace("EARLY", early).replace("KW", "children=True"), env=env, check=False)
        assert "forkserver" in r.stderr and "before" in r.stderr, r.stdout + r.stderr


def test_allocator_modules_are_lazy_and_strict():
    import importlib

    for mod, attr in (("cupy", "ump_cupy_allocator"), ("torch", "ump_torch_allocator"), ("numba", "UmpNumbaManager")):
        m = importlib.import_module(f"ump_alloc.allocators.{mod}")
        assert m.__all__[0] == attr and m.__doc__
        with pytest.raises(AttributeError):
            m.no_such_thing
    try:
        import cupy  # noqa: F401
    except ImportError:
        from ump_alloc.allocators import cupy as ac

        with pytest.raises(ImportError):
            ac.ump_cupy_allocator


@pytest.mark.parametrize("kind, device, what", [
    ("host", -1, "host"),                     # was "host, host"
    ("device", 0, "device 0"),                # was "device, device 0"
    ("registered", -1, "registered, host"),
    ("managed", 1, "managed, device 1"),
    ("unknown", -1, "unknown, host"),
])
def test_identity_names_kind_and_place_once(kind, device, what):
    """``repr(identify(x))`` names the kind of memory and where it lives, once where one names
    the other (``identify`` printed "ours, host, host")."""
    gpu = device >= 0 or kind == "registered"  # pinned host memory: the GPU reaches it
    ident = ump_alloc.Identity(address=0x1040, ours=kind != "unknown", kind=kind, base=0x1000 if kind != "unknown" else 0,
                               size=4096, device=device, host_accessible=True, device_accessible=gpu)
    text = repr(ident)
    ours = "ours" if kind != "unknown" else "not ours"
    block = ", block 0x1000+4096" if kind != "unknown" else ""
    access = "host, device" if gpu else "host"
    assert text == f"<Identity 0x1040: {ours}, {what}{block}, reachable by: {access}>", text


def test_identity_of_pinned_memory_not_pinned_yet_says_so():
    """Pinned host memory that waits for the process's first use of a GPU (UMP_ALLOC_PIN=lazy):
    the host reaches it, the GPU not yet, and the repr says why."""
    ident = ump_alloc.Identity(address=0x1040, ours=True, kind="registered", base=0x1000, size=4096, device=-1,
                               host_accessible=True, device_accessible=False)
    assert repr(ident) == ("<Identity 0x1040: ours, registered, host, block 0x1000+4096, reachable by: host "
                           "(not pinned yet: no GPU used in this process)>"), repr(ident)


def test_identity_of_a_numpy_array_says_host_once(ump):
    a = np.ones(1000)
    text = repr(ump_alloc.identify(a))
    if ump_alloc.mode() == "host":
        assert ": ours, host, block " in text and "host, host" not in text, text
    assert text.endswith(", reachable by: host>") or text.endswith(", reachable by: host, device>"), text
