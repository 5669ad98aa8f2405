"""ump_alloc.dask on a distributed.LocalCluster (CPU, host mode): the arrays of a dask.array
computation are ump blocks in every worker, results match NumPy, and the worker metrics carry
ump-alloc's counters. A control cluster without the plugin shows the check can fail."""

import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
da = pytest.importorskip("dask.array")

from distributed import Client, LocalCluster  # noqa: E402


def _flags(client):
    import ump_alloc

    x = da.random.default_rng(7).random((1200, 1200), chunks=300)
    y = (x + 1.0) * 2.0  # arrays made inside the tasks
    flags = y.map_blocks(lambda b: np.full((1, 1), ump_alloc.handles(b)), chunks=(1, 1), dtype=bool)
    got = client.compute(flags).result()
    total = client.compute(y.sum()).result()
    local = ((np.asarray(x.compute()) + 1.0) * 2.0).sum()
    return got, total, local


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=":0") as c:
        yield c


def test_without_the_plugin_task_arrays_are_not_ours(cluster):
    with Client(cluster) as client:
        got, total, local = _flags(client)
    assert not got.any(), "control: without the plugin no worker should use ump-alloc"
    assert np.isclose(total, local)


def test_worker_plugin_enables_ump_alloc_in_every_worker(cluster):
    import ump_alloc.dask as ud

    with Client(cluster) as client:
        client.register_plugin(ud.UmpWorkerPlugin(cupy=False, torch=False))
        got, total, local = _flags(client)
        assert got.all(), f"{int((~got).sum())} of {got.size} task arrays were not ump blocks"
        assert np.isclose(total, local), (total, local)
        deadline = time.time() + 20
        while time.time() < deadline:  # metrics travel with the heartbeats
            ms = [w["metrics"] for w in client.scheduler_info()["workers"].values()]
            if all("ump_alloc_host_mapped" in m and m["ump_alloc_host_mapped"] > 0 for m in ms):
                break
            time.sleep(0.5)
        assert all(m.get("ump_alloc_host_mapped", 0) > 0 for m in ms), ms
        client.unregister_worker_plugin("ump-alloc")


def test_nanny_plugin_sets_the_environment_before_workers_start():
    import ump_alloc.dask as ud

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as c:
        with Client(c) as client:
            ud.register(client, environment={"mode": "host", "host_retain": "32M"}, cupy=False, torch=False)
            env = client.run(lambda: {k: v for k, v in __import__("os").environ.items() if k.startswith("UMP_ALLOC")})
            (worker_env,) = env.values()
            assert worker_env.get("UMP_ALLOC") == "1" and worker_env.get("UMP_ALLOC_MODE") == "host", worker_env
            assert worker_env.get("UMP_ALLOC_HOST_RETAIN") == "32M"
            got, total, local = _flags(client)
            assert got.all() and np.isclose(total, local)
