"""Dask integration: ump-alloc in every worker of a ``distributed`` cluster, as dask-cuda sets up
RMM.

Two plugins, used alone or together::

    from distributed import Client
    import ump_alloc.dask

    client = Client(cluster)
    ump_alloc.dask.register(client)             # both plugins, default settings
    # or one by one:
    client.register_plugin(ump_alloc.dask.UmpNannyPlugin(mode="pinned", limit="64G"))
    client.register_plugin(ump_alloc.dask.UmpWorkerPlugin())

- :class:`UmpNannyPlugin` sets ``UMP_ALLOC=1`` and ``UMP_ALLOC_*`` variables in each worker's
  environment before the worker process starts (what must be known at import: the mode, the
  alignment, limits). Registering it restarts the workers of nannies that are running.
- :class:`UmpWorkerPlugin` calls :func:`ump_alloc.enable` inside each worker (NumPy, and CuPy /
  PyTorch where installed and a GPU mode is in force) and adds ump-alloc's counters to the
  worker's metrics (``client.scheduler_info()["workers"][addr]["metrics"]``:
  ``ump_alloc_host_in_use``, ``ump_alloc_host_mapped``, ``ump_alloc_device_in_use``,
  ``ump_alloc_device_mapped``).

NumPy's allocator is chosen per thread (a ContextVar), a worker's thread pool may exist before
the plugin runs, and each task runs in a fresh copy of the event loop's context. The worker
plugin therefore wraps the function distributed runs every task through
(``distributed.worker._run_task``) so that each task starts on ump-alloc's NumPy handler (a
check and a ContextVar set per task, well under a microsecond).
"""

from __future__ import annotations

from distributed.diagnostics.plugin import NannyPlugin, WorkerPlugin

__all__ = ["UmpWorkerPlugin", "UmpNannyPlugin", "register", "worker_metrics"]


def worker_metrics(worker=None) -> dict:
    """ump-alloc's main counters in this process, as flat numbers (bytes)."""
    import ump_alloc

    s = ump_alloc.stats()
    devices = s["devices"].values()
    return {
        "ump_alloc_host_in_use": int(s["host"]["in_use"]),
        "ump_alloc_host_mapped": int(s["host"]["mapped"]),
        "ump_alloc_device_in_use": int(sum(d["in_use"] for d in devices)),
        "ump_alloc_device_mapped": int(sum(d["mapped"] for d in devices)),
    }


def _metric(key: str):
    def read(worker) -> int:
        return worker_metrics(worker)[key]

    return read


def _run_on_ump(fn, *args, **kwargs):
    from . import _numpy

    if not _numpy.active():
        _numpy.install(threads=False)
    return fn(*args, **kwargs)


# distributed runs each task through this module-level function, inside the task's copied
# context (distributed.utils.run_in_executor_with_context): wrapping it is what reaches that
# context. Checked names, newest first.
_TASK_RUNNERS = ("_run_task", "apply_function")


def _wrap_task_runner() -> bool:
    from distributed import worker as w

    for name in _TASK_RUNNERS:
        original = getattr(w, name, None)
        if original is None:
            continue
        if getattr(original, "_ump_alloc_original", None) is not None:
            return True

        def run(*args, _original=original, **kwargs):
            return _run_on_ump(_original, *args, **kwargs)

        run._ump_alloc_original = original
        setattr(w, name, run)
        return True
    return False


def _unwrap_task_runner() -> None:
    from distributed import worker as w

    for name in _TASK_RUNNERS:
        original = getattr(getattr(w, name, None), "_ump_alloc_original", None)
        if original is not None:
            setattr(w, name, original)


class UmpWorkerPlugin(WorkerPlugin):
    """Enable ump-alloc in each worker: ``ump_alloc.enable(**kwargs)`` (see its arguments:
    ``numpy``, ``cupy``, ``torch``, ``mode``, ``alignment``, ``threads``), and publish its
    counters as worker metrics."""

    name = "ump-alloc"

    def __init__(self, **enable_kwargs) -> None:
        self.enable_kwargs = enable_kwargs

    def setup(self, worker) -> None:
        import ump_alloc

        ump_alloc.enable(**self.enable_kwargs)
        if self.enable_kwargs.get("numpy", True) and not _wrap_task_runner():
            import warnings

            warnings.warn(
                "ump_alloc.dask: this version of distributed runs tasks through no known function "
                f"({', '.join(_TASK_RUNNERS)}); task threads that existed before the plugin keep "
                "NumPy's default allocator",
                RuntimeWarning,
                stacklevel=2,
            )
        for key in worker_metrics():
            worker.metrics[key] = _metric(key)

    def teardown(self, worker) -> None:
        _unwrap_task_runner()
        for key in list(getattr(worker, "metrics", {})):
            if key.startswith("ump_alloc_"):
                del worker.metrics[key]


class UmpNannyPlugin(NannyPlugin):
    """Set ``UMP_ALLOC=1`` and ``UMP_ALLOC_<NAME>=value`` for each keyword (``mode="pinned"``,
    ``limit="64G"``, ``alignment=4096``, ...) in the environment of the worker processes, before
    they start. Registering it restarts running workers so that the settings apply."""

    name = "ump-alloc-environment"
    restart = True

    def __init__(self, **settings) -> None:
        self.environ = {"UMP_ALLOC": "1"}
        for key, value in settings.items():
            self.environ[f"UMP_ALLOC_{key.upper()}"] = str(value)

    def setup(self, nanny) -> None:
        nanny.env.update(self.environ)


def register(client, *, environment: dict | None = None, **enable_kwargs) -> None:
    """Register both plugins on ``client``'s cluster: :class:`UmpNannyPlugin` with
    ``environment`` (``UMP_ALLOC_*`` settings by short name) when the workers have nannies, then
    :class:`UmpWorkerPlugin` with ``enable_kwargs``."""
    if environment is not None or _has_nannies(client):
        client.register_plugin(UmpNannyPlugin(**(environment or {})))
    client.register_plugin(UmpWorkerPlugin(**enable_kwargs))


def _has_nannies(client) -> bool:
    workers = client.scheduler_info().get("workers", {})
    return any(w.get("nanny") for w in workers.values())
