"""Every benchmark script takes --help, and on a machine without a GPU (CI) the GPU ones skip
cleanly: exit 0 with one "skipped: ..." line, never a traceback."""

import os
import subprocess
import sys

import pytest
from conftest import GPU

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCHES = sorted(f for f in os.listdir(os.path.join(ROOT, "benches")) if f.endswith(".py") and not f.startswith("_"))
# The archived probes (benches/archive/): run from there, with the same promises.
PROBES = sorted(
    "archive/" + f for f in os.listdir(os.path.join(ROOT, "benches", "archive")) if f.endswith("_probe.py")
)
GPU_BENCHES = {
    "archive/asnumpy_parts_probe.py": ["--gib", "0.01", "--rounds", "1"],
    "archive/asnumpy_read_probe.py": ["--gib", "0.01", "--rounds", "1"],
    "archive/async_copy_probe.py": ["--trials", "1"],
    "archive/managed_pressure_probe.py": ["--hold", "0.1", "--mib", "1"],
    "archive/explicit_ab_probe.py": ["--mib", "1", "--pairs", "2"],
    "archive/explicit_overhead_probe.py": ["--mib", "1", "--reps", "1"],
    "churn_bench.py": [],
    "cupy_alloc_bench.py": ["--n", "10", "--rounds", "1"],
    "fragmentation_bench.py": ["--repeat", "1"],
    "managed_residency_bench.py": ["--gib", "0.01", "--rounds", "1"],
    "no_context_bench.py": ["--rounds", "1", "--pool", "1"],
    "archive/host_pages_probe.py": ["--gib", "0.01", "--reps", "1"],
    "archive/pageable_h2d_probe.py": ["x"],
    "archive/dataloader_ab_probe.py": ["--epochs", "1"],
    "dataloader_fork_bench.py": ["--epochs", "1", "--events", "--cpus", "0", "--variants", "plain,ump-none"],
    "archive/pinned_probe.py": ["--gib", "0.01", "--reps", "1"],
    "pipeline_bench.py": ["--mib", "1", "--iters", "1"],
    "torch_patch_overhead_bench.py": [],
    "archive/torch_pipeline_phases_probe.py": ["x"],
    "torch_training_bench.py": ["--models", "resnet18", "--rounds", "1"],
    "torch_transfer_bench.py": [],
    "transfer_bench.py": ["--repeat", "1", "--mib", "1", "--iters", "1", "--gib", "0.01", "--rounds", "1"],
    "zero_copy_bench.py": ["transfer"],
}


def _run(name, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    return subprocess.run(
        [sys.executable, os.path.join(ROOT, "benches", name), *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_every_bench_is_listed():
    assert set(GPU_BENCHES) <= set(BENCHES) | set(PROBES)
    assert len(BENCHES) >= 9, BENCHES
    assert not [f for f in os.listdir(os.path.join(ROOT, "benches")) if "_probe." in f], "probes go to benches/archive/"


def test_archived_probes_name_their_command():
    """Every archived probe's header gives the command that builds or runs it from there."""
    folder = os.path.join(ROOT, "benches", "archive")
    probes = sorted(f for f in os.listdir(folder) if "_probe." in f)
    assert len(probes) >= 10, probes
    with open(os.path.join(folder, "README.md")) as f:
        readme = f.read()
    for name in probes:
        with open(os.path.join(folder, name)) as f:
            head = f.read(3000)
        assert f"benches/archive/{name}" in head, name
        assert f"`{name}`" in readme, f"benches/archive/README.md does not list {name}"


@pytest.mark.parametrize("name", BENCHES + PROBES)
def test_help(name):
    r = _run(name, "--help")
    assert r.returncode == 0, r.stderr
    assert "usage:" in r.stdout and "Traceback" not in r.stderr


@pytest.mark.skipif(GPU, reason="a GPU is here: the benchmarks would run, not skip")
@pytest.mark.parametrize("name", sorted(GPU_BENCHES))
def test_gpu_benches_skip_cleanly_without_a_gpu(name):
    r = _run(name, *GPU_BENCHES[name])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("skipped: "), r.stdout
    assert "Traceback" not in r.stderr, r.stderr


def test_run_lists_every_bench_with_its_needs():
    """``benches/run.py list`` names every ``*_bench.py`` with a purpose and what it needs."""
    r = _run("run.py", "list")
    assert r.returncode == 0, r.stderr
    names = sorted(f[: -len("_bench.py")] for f in BENCHES if f.endswith("_bench.py"))
    listed = [line.split()[0] for line in r.stdout.splitlines() if line and not line[0].isspace()]
    assert set(names) <= set(listed), (names, r.stdout)
    assert "(not recorded" not in r.stdout, r.stdout
    assert r.stdout.count("needs: ") == len(names), r.stdout


def test_run_passes_arguments_through():
    r = _run("run.py", "small_arrays", "--help")
    assert r.returncode == 0 and "usage: small_arrays_bench.py" in r.stdout, r.stdout + r.stderr
    r = _run("run.py", "no_such_bench")
    assert r.returncode == 2 and "the benches: " in r.stderr, r.stderr
