"""GPU tests (marked gpu, skipped without a GPU). Each check runs in a fresh interpreter with
the mode under test; see gpu_checks.py."""

import os
import subprocess
import sys

import pytest

from conftest import GPU, run_python

pytestmark = pytest.mark.gpu
HERE = os.path.dirname(os.path.abspath(__file__))


def _caps():
    import ump_alloc

    return ump_alloc.capabilities() if GPU else {"devices": []}


def supported_modes():
    caps = _caps()
    if not caps["devices"]:
        return []
    d = caps["devices"]
    modes = ["device"]
    if all(x["concurrent_managed_access"] for x in d):
        modes.append("managed")
    if all(x["host_register_supported"] and x["host_pointer_for_registered_mem"] for x in d):
        modes.append("registered")
        if "managed" in modes:
            modes.append("pinned")
    if all(x["pageable_memory_access"] for x in d):
        modes.append("system")
    return modes


SHARED = [m for m in supported_modes() if m != "device"]
# Checks of ump-alloc's own caching under PyTorch (stream order, its record_stream, its
# statistics and limit messages): the swap route, where every tensor is an ump-alloc block.
SWAP = {"UMP_ALLOC_TORCH_ROUTE": "swap"}
# Checks whose arrays are made before the process's first use of a GPU and must be pinned host
# memory once it comes (shared with fork children, reachable by kernels): `lazy-all`. At the
# default (`lazy`) such large blocks are plain host memory where shared memory has 4 KiB pages
# (issue 33: they cost a NumPy-only process nothing); test_no_context.py holds that rule.
EARLY_PINNED = {"UMP_ALLOC_PIN": "lazy-all"}


def check(name, mode=None, extra=None):
    env = dict(extra or {})
    if mode:
        env["UMP_ALLOC_MODE"] = mode
    env["UMP_GPU_COUNT"] = str(len(_caps()["devices"]))
    r = run_python(f"import sys; sys.path.insert(0, {HERE!r}); import gpu_checks as g; g.{name}(); print('PASS')", env=env, check=False)
    print(r.stdout)
    assert r.returncode == 0 and "PASS" in r.stdout, f"{name} [{mode}] failed:\n{r.stdout}\n{r.stderr}"
    return r


def test_auto_mode_selection():
    check("auto_mode")


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_numpy_shared_with_cupy_and_torch(mode):
    check("numpy_shared_with_cupy_and_torch", mode, EARLY_PINNED)


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_cupy_arrays_are_host_readable(mode):
    check("cupy_arrays_are_host_readable", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_cupy_workload_matches_default(mode):
    check("cupy_workload_matches_default", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_torch_workload_on_ump(mode):
    check("torch_workload_on_ump", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_device_argument(mode):
    check("device_argument", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_out_of_memory(mode):
    check("out_of_memory", mode, {"UMP_ALLOC_LIMIT": "256M"})


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_torch_out_of_memory(mode):
    check("torch_out_of_memory", mode, {"UMP_ALLOC_LIMIT": "256M", **SWAP})


@pytest.mark.parametrize("mode", ["managed", "device"])
def test_torch_record_stream(mode):
    check("torch_record_stream", mode, SWAP)


def test_torch_empty_cache_and_fraction():
    check("torch_empty_cache_and_fraction", "managed", SWAP)


def test_forcing_system_without_hmm_is_refused():
    if "system" in supported_modes():
        pytest.skip("this GPU has pageable memory access")
    check("system_mode_refused", "system")


def test_managed_fresh_probe():
    check("managed_fresh_reads_zero", "managed")


def test_env_var_enables_everything_without_code_change():
    code = (
        "import numpy as np, cupy as cp, torch, ump_alloc\n"
        "a = np.random.default_rng(0).random(1000)\n"
        "g = cp.arange(1000, dtype=cp.float32)\n"
        "t = torch.ones(1000, device='cuda')\n"
        "print(ump_alloc.handles(a), ump_alloc.identify(g).ours, ump_alloc.identify(t).ours, ump_alloc.mode())\n"
    )
    r = run_python(code, env={"UMP_ALLOC": "1"})
    words = r.stdout.split()
    assert words[:3] == ["True", "True", "True"], r.stdout + r.stderr
    assert words[3] in ("pinned", "system"), r.stdout


def test_torch_too_late_is_explained():
    code = (
        "import torch, ump_alloc\n"
        "x = torch.ones(10, device='cuda')\n"
        "try:\n"
        "    ump_alloc.enable(cupy=False, torch=True)\n"
        "except ump_alloc.UmpError as e:\n"
        "    print('ERR', e)\n"
    )
    r = run_python(code, env=SWAP)
    assert "ERR too late" in r.stdout and "before the first CUDA tensor" in r.stdout, r.stdout + r.stderr
    assert "UMP_ALLOC_TORCH_ROUTE=segments" in r.stdout, "the message names the route that works late"


def test_demo_shows_in_place_kernel():
    r = subprocess.run([sys.executable, "-m", "ump_alloc", "demo"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "CuPy kernel wrote the NumPy array in place" in r.stdout and "check: ok" in r.stdout
    print(r.stdout)


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_stream_correctness_zero_copy(mode):
    check("stream_correctness", mode)


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_asnumpy_paths(mode):
    check("asnumpy_paths", mode)


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_asarray_paths(mode):
    check("asarray_paths", mode, EARLY_PINNED)


# ---- issue 5 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_stream_reuse_cupy(mode):
    check("stream_reuse_cupy", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_stream_reuse_torch(mode):
    check("stream_reuse_torch", mode, SWAP)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_stats_and_peaks_torch(mode):
    check("stats_and_peaks_torch", mode, SWAP)


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_scope_loop_is_flat(mode):
    check("scope_loop_is_flat", mode)


def test_headroom_keeps_device_memory_free():
    import ump_alloc

    if "managed" not in supported_modes():
        pytest.skip("needs managed memory")
    total = ump_alloc.capabilities()["devices"][0]["total_memory"]
    free = int(run_python("import cupy; print(cupy.cuda.runtime.memGetInfo()[0])").stdout.split()[-1])
    check("headroom_keeps_device_memory_free", "managed", {"UMP_ALLOC_HEADROOM": str(max(0, free - (512 << 20)))})
    assert total > 0


@pytest.mark.skipif("pinned" not in supported_modes(), reason="no pinned host side on this GPU")
def test_pinned_cap_falls_back_to_plain_memory_with_one_warning():
    r = check("pinned_cap_fallback", "pinned", {"UMP_ALLOC_PINNED_LIMIT": "64M", **EARLY_PINNED})
    assert r.stderr.count("ump-alloc: warning:") == 1, r.stderr


@pytest.mark.parametrize("mode", [m for m in supported_modes() if m != "managed"] or ["pinned"])
def test_fork_child_of_a_cuda_process(mode):
    check("fork_child_of_a_cuda_process", mode)


def test_dataloader_fork_workers():
    check("dataloader_fork_workers", None, {"UMP_ALLOC": "1"})


@pytest.mark.parametrize("mode", ["managed", "device"])
def test_numba_emm_plugin(mode):
    pytest.importorskip("numba.cuda")
    check("numba_emm", mode, {"NUMBA_CUDA_MEMORY_MANAGER": "ump_alloc.numba"})


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_cupy_fast_path(mode):
    check("cupy_fast_path", mode, {"UMP_ALLOC_LIMIT": "256M"})


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_cupy_stream_retirement(mode):
    check("cupy_stream_retirement", mode)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_torch_fast_cpu(fast):
    check("torch_fast_cpu", None, {"UMP_ALLOC_TORCH_FAST_CPU": fast})


@pytest.mark.parametrize("unified", ["1", "0"])
@pytest.mark.parametrize("mode", ["pinned", "managed"])
def test_torch_unified(mode, unified):
    if mode not in supported_modes():
        pytest.skip(f"{mode} not supported here")
    check("torch_unified", mode, {"UMP_ALLOC_TORCH_UNIFIED": unified})


@pytest.mark.parametrize("on", ["1", "0"])
@pytest.mark.parametrize("mode", ["pinned", "managed"])
def test_cupy_zero_copy(mode, on):
    if mode not in supported_modes():
        pytest.skip(f"{mode} not supported here")
    check("cupy_zero_copy", mode, {"UMP_ALLOC_CUPY_ZERO_COPY": on})


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_memory_summary_streams(mode):
    check("memory_summary_streams", mode)


def test_dask_cupy_workers():
    pytest.importorskip("distributed")
    check("dask_cupy", None)


def test_public_cupy_allocator():
    check("public_cupy_allocator", "managed")


def test_public_torch_allocator():
    check("public_torch_allocator", "managed", {"UMP_ALLOC_LIMIT": "64G"})


# ---- issue 12: the virtual-memory device pool and managed-memory residency ---------------------


@pytest.mark.parametrize("vmm", ["1", "0"])
def test_vmm_device_pool(vmm):
    check("vmm_device_pool", "device", {"UMP_ALLOC_DEVICE_VMM": vmm})


def test_vmm_purge_waits_for_queued_work():
    check("vmm_purge_waits_for_queued_work", "device")


def test_vmm_idle_pages_go_back():
    check("vmm_idle_pages_go_back", "device")


@pytest.mark.parametrize("mode", ["pinned", "registered"])
def test_numpy_realloc_in_place(mode):
    check("numpy_realloc_in_place", mode)


@pytest.mark.parametrize("discard", ["1", "0"])
def test_managed_residency(discard):
    check("managed_residency", "pinned", {"UMP_ALLOC_MANAGED_DISCARD": discard})


# ---- issue 22: explicit transfers pick the faster of a view and a DMA copy ---------------------


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_transfer_choice_cupy(mode):
    check("transfer_choice_cupy", mode)


@pytest.mark.parametrize("mode", supported_modes() or ["managed"])
def test_transfer_choice_torch(mode):
    check("transfer_choice_torch", mode)


def test_cupy_staging_fallback():
    check("cupy_staging_fallback")


@pytest.mark.parametrize("mode", SHARED or ["managed"])
def test_numpy_thread_made_before_enable(mode):
    check("numpy_thread_made_before_enable", mode, EARLY_PINNED)


# ---- issue 20: fork() and the pinned host side ---------------------------------------------------


@pytest.mark.skipif("pinned" not in supported_modes(), reason="no pinned host side on this GPU")
@pytest.mark.parametrize("fork", ["share", "copy"])
def test_fork_pinned_pages(fork):
    check("fork_pinned_pages", "pinned", {"UMP_ALLOC_PINNED_FORK": fork, **EARLY_PINNED})


@pytest.mark.skipif("pinned" not in supported_modes(), reason="no pinned host side on this GPU")
@pytest.mark.parametrize("fork", ["share", "copy"])
def test_fork_holds_freed_blocks(fork):
    check("fork_holds_freed_blocks", "pinned", {"UMP_ALLOC_PINNED_FORK": fork, **EARLY_PINNED})


@pytest.mark.skipif("pinned" not in supported_modes(), reason="no pinned host side on this GPU")
def test_fork_children_leak_nothing():
    check("fork_children_leak_nothing", "pinned", EARLY_PINNED)


@pytest.mark.parametrize("control", ["0", "1"])
def test_plain_host_side_loads_no_cuda(control):
    env = {"UMP_GPU_CONTROL": control, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    if control == "0":
        env["UMP_ALLOC_HOST_SIDE"] = "host"
    else:
        env["UMP_ALLOC_PIN"] = "eager"  # pins at enable(): loads the driver (lazy waits for a GPU use)
    check("plain_host_side_loads_no_cuda", None, env)


@pytest.mark.skipif("pinned" not in supported_modes(), reason="no pinned host side on this GPU")
def test_fork_while_threads_allocate_on_shared_pinned_pages():
    """test_fork's churn (two threads allocating and freeing NumPy arrays while the main thread
    forks 60 times; each child reads, writes and allocates) on the pinned host side, whose fork
    handlers now also open a generation and hand the child its lock."""
    from test_fork import FORK_CHURN

    r = run_python(FORK_CHURN.replace("FORKS", "60"), env={"UMP_ALLOC_MODE": "pinned"})
    ok, forks, first = r.stdout.split()
    assert ok == forks == "60", r.stderr
    assert first == "0", "the child's write reached the parent"


# ---- issue 21 ------------------------------------------------------------------------------------


def test_device_realloc_waits_for_the_stream():
    check("device_realloc_waits_for_the_stream", "pinned")
