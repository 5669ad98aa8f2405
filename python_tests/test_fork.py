"""fork() safety: children of a process whose threads are inside the allocator must find it
usable, and multiprocessing pools (fork, spawn, forkserver) work on arrays made under
UMP_ALLOC=1. Each test runs in a fresh interpreter, so that its configuration is its own."""

import os
import textwrap

import pytest

from conftest import GPU, run_python

FORK_CHURN = textwrap.dedent(
    r"""
    import os, sys, threading, time
    import numpy as np
    import ump_alloc
    ump_alloc.enable(cupy=False, torch=False)

    stop = False
    def churn(seed):
        rng = np.random.default_rng(seed)
        while not stop:
            n = int(rng.integers(1, 5_000_000)) if rng.random() < 0.05 else int(rng.integers(1, 4096))
            a = np.empty(n, np.uint8)
            a[:1] = 7
            del a
    threads = [threading.Thread(target=churn, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()

    parent = np.arange(1_000_000, dtype=np.int64)    # made before every fork
    ok = 0
    for i in range(FORKS):
        pid = os.fork()
        if pid == 0:
            try:
                assert int(parent[123_456]) == 123_456 and int(parent.sum()) == 499999500000
                parent[0] = -1                        # writable (copy-on-write)
                small = np.ones(125, np.float64)      # 1000 B
                big = np.full(1 << 17, 3.0)           # 1 MiB
                assert small.sum() == 125 and big[-1] == 3.0
                assert ump_alloc.handles(small) and ump_alloc.handles(big)
                del small, big
                ump_alloc.trim()
                os._exit(0)
            except BaseException as e:
                print("child", i, repr(e), file=sys.stderr, flush=True)
                os._exit(3)
        deadline = time.monotonic() + 30
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                print("child", i, "hung", file=sys.stderr, flush=True)
                status = -1
                break
            time.sleep(0.002)
        ok += status == 0
    stop = True
    for t in threads:
        t.join()
    print(ok, FORKS, int(parent[0]))
    """
)


def test_fork_while_threads_allocate():
    r = run_python(FORK_CHURN.replace("FORKS", "60"), env={"UMP_ALLOC_NO_CUDA": "1"})
    ok, forks, first = r.stdout.split()
    assert ok == forks == "60", r.stderr
    assert first == "0", "the child's write did not reach the parent"


POOLS = textwrap.dedent(
    r"""
    import multiprocessing as mp, sys
    import numpy as np

    DATA = None

    def init(data):
        global DATA
        DATA = data

    def work(i):
        # Read the parent's array (inherited through fork, or pickled for spawn/forkserver) and
        # make new ones in the worker.
        import ump_alloc
        x = DATA[i * 1000:(i + 1) * 1000].astype(np.float64) * 2
        y = np.concatenate([x, np.ones(10_000)])
        return float(x.sum()), bool(ump_alloc.handles(y)), ump_alloc.mode()

    if __name__ == "__main__":
        import ump_alloc
        data = np.arange(100_000, dtype=np.int64)
        assert ump_alloc.handles(data), "UMP_ALLOC=1 put NumPy on ump-alloc"
        method = sys.argv[1]
        ctx = mp.get_context(method)
        with ctx.Pool(4, initializer=init, initargs=(data,)) as pool:
            out = pool.map(work, range(100), chunksize=5)
        want = [float(np.arange(i * 1000, (i + 1) * 1000).sum() * 2) for i in range(100)]
        assert [o[0] for o in out] == want
        print(method, all(o[1] for o in out), sorted({o[2] for o in out}))
    """
)


def _pth_installed():
    import site
    import sysconfig

    dirs = set(site.getsitepackages() + [sysconfig.get_paths()["purelib"]])
    return any(os.path.exists(os.path.join(d, "ump_alloc.pth")) for d in dirs)


MODES = ["host"] if not GPU else ["pinned", "registered", "device", "managed"]


@pytest.mark.skipif(not _pth_installed(), reason="ump_alloc.pth not installed (pip install .)")
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
@pytest.mark.parametrize("mode", MODES)
def test_multiprocessing_pools_under_ump_alloc(tmp_path, method, mode):
    if mode == "managed" and method == "fork":
        pytest.skip("a managed host side is not fork-safe: children must not touch the parent's arrays "
                    "(documented; the default pinned host side is)")
    script = tmp_path / "pools.py"
    script.write_text(POOLS)
    env = {"UMP_ALLOC": "1", "UMP_ALLOC_MODE": mode}
    if mode == "host":
        env["UMP_ALLOC_NO_CUDA"] = "1"
    r = run_python(f"import runpy, sys; sys.argv=[{str(script)!r}, {method!r}]; "
                   f"runpy.run_path({str(script)!r}, run_name='__main__')", env=env)
    got_method, handled, modes = r.stdout.strip().split(maxsplit=2)
    assert got_method == method
    assert handled == "True", "workers' arrays come from ump-alloc"
    assert modes == f"['{mode}']"
