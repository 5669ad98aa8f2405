"""python -m ump_alloc bench: alternating rounds in fresh interpreters, medians with their spread,
a verdict only where the runs allow one, the host part without a GPU, and --plot refused up
front when it could not be drawn."""

import json
import os
import subprocess
import sys
import time

import pytest

from ump_alloc import bench as _bench


def _bench_cmd(*args, env=None, timeout=600):
    e = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "ump_alloc", "bench", *args], capture_output=True, text=True,
                          env=e, timeout=timeout)


def test_bench_quick_json_alternates_rounds_of_both_allocators():
    r = _bench_cmd("--quick", "--json", "--rounds", "3")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["rounds"] == 3
    names = {row["name"]: row for row in out["rows"]}
    assert set(_bench.NUMPY_ROWS.values()) <= set(names), sorted(names)
    for name in _bench.NUMPY_ROWS.values():
        row = names[name]
        assert len(row["default_runs"]) == 3 and len(row["ump_runs"]) == 3, row
        assert all(v > 0 for v in row["default_runs"] + row["ump_runs"]), row
        assert row["default"] == sorted(row["default_runs"])[1] and row["ump"] == sorted(row["ump_runs"])[1], row
        assert row["better"] == _bench.verdict(name, row["default_runs"], row["ump_runs"]), row
    if not out["gpu"]:
        assert any("no CUDA GPU" in s for s in out["skipped"])
    # The whole programs (issue 35): the program's time, the whole process's and its peak memory,
    # the checksums equal under both allocators (the bench stops otherwise).
    programs = [_bench.PROGRAM_ROWS["mixed"]] + ([_bench.PROGRAM_ROWS["pandas"]] if _bench._has("pandas") else [])
    for program in programs:
        for suffix in (" (ms)", ", whole process (ms)", ", peak memory of the process (MiB)"):
            row = names[program + suffix]
            assert len(row["ump_runs"]) == 3 and all(v > 0 for v in row["default_runs"] + row["ump_runs"]), row
    if not _bench._has("pandas"):
        assert any("pandas" in s for s in out["skipped"])
    # The allocation loops are marked as such, and the table says what the mark means.
    assert all(name.startswith("* ") for name in _bench.NUMPY_ROWS.values())
    assert "* A loop that does little but allocate" in _bench.table(out)
    # Six runs, alternating, the order flipping each round.
    progress = [x for x in r.stderr.replace("\r", "\n").splitlines() if "round " in x]
    order = [("ump-alloc" in x) for x in progress if "numpy" in x]
    assert order == [False, True, True, False, False, True], progress


def test_verdict_only_where_every_run_beats_every_other():
    ms = "x (ms)"
    assert _bench.verdict(ms, [10, 11, 11.5, 12], [5, 6, 6.5, 7]) == "ump-alloc 1.80x faster"
    assert _bench.verdict(ms, [5, 6, 6.5, 7], [10, 11, 11.5, 12]) == "default 1.80x faster"
    # A single overlapping run withholds the verdict, whatever the medians say: the noise
    # that flipped the old single-run verdict between "ump 1.99x" and "default 1.78x".
    assert _bench.verdict(ms, [147, 150, 152, 345], [120, 125, 126, 160]) == "same within noise"
    # Too few runs for any verdict (3 each: 1 chance in 10 by luck).
    assert _bench.verdict(ms, [10, 11, 12], [5, 6, 7]) == "too few rounds for a verdict"
    assert _bench.verdict(ms, [10], []) == "-"
    gbs = "y (GB/s)"  # higher is better
    assert _bench.verdict(gbs, [10, 11, 11, 12], [50, 51, 51, 52]) == "ump-alloc 4.64x faster"
    assert _bench.verdict(gbs, [50, 51, 51, 52], [10, 11, 11, 12]) == "default 4.64x faster"
    assert _bench._chance(4) == 35 and _bench._chance(5) == 126 and _bench._chance(7) == 1716
    mib = "z, peak memory of the process (MiB)"  # lower is better, in memory
    assert _bench.verdict(mib, [250, 251, 251, 252], [260, 261, 262, 262]) == "default 1.04x less memory"


def test_table_shows_medians_spread_and_verdict(tmp_path):
    rows = [{"name": "x (GB/s)", "default": 2.0, "ump": 4.0, "default_runs": [1.9, 2.0, 2.0, 2.1],
             "ump_runs": [3.9, 4.0, 4.0, 4.2]},
            {"name": "y (ns)", "default": 100.0, "ump": 200.0, "default_runs": [90.0, 100.0, 100.0, 250.0],
             "ump_runs": [180.0, 200.0, 200.0, 230.0]}]
    for row in rows:
        row["better"] = _bench.verdict(row["name"], row["default_runs"], row["ump_runs"])
    result = {"rows": rows, "skipped": ["torch: not installed"], "gpu": False, "quick": True, "rounds": 4,
              "python": "3", "time": "now"}
    text = _bench.table(result)
    assert "2.00 (1.90-2.10)" in text and "4.00 (3.90-4.20)" in text, text
    assert "ump-alloc 2.00x faster" in text and "100.0 (90.0-250.0)" in text and "same within noise" in text, text
    assert "1 chance in 35 with 4 rounds" in text and "not measured: torch" in text
    assert "only the host part ran" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    _bench.plot(result, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_fails_before_measuring(tmp_path):
    # A matplotlib that cannot be imported, whether or not the real one is installed.
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named matplotlib (test stub)')\n")
    t = time.perf_counter()
    r = _bench_cmd("--quick", "--plot", str(tmp_path / "chart.png"), env={"PYTHONPATH": str(tmp_path / "stub")})
    elapsed = time.perf_counter() - t
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.strip().endswith(": pip install matplotlib"), r.stderr
    assert "ump-alloc[bench]" not in r.stderr and r.stdout == "", r.stderr
    assert "round " not in r.stderr, "measured before failing"
    assert not (tmp_path / "chart.png").exists()
    assert elapsed < 30, elapsed
    # A broken matplotlib (a folder left without __init__.py: `use` is an AttributeError) is
    # refused up front too, not with a traceback.
    (stub / "__init__.py").unlink()
    r = _bench_cmd("--quick", "--plot", str(tmp_path / "chart.png"), env={"PYTHONPATH": str(tmp_path / "stub")})
    assert r.returncode == 2 and r.stderr.strip().endswith(": pip install matplotlib"), r.stderr
    assert "Traceback" not in r.stderr and "round " not in r.stderr and r.stdout == "", r.stderr
    # A folder that does not exist is refused up front too.
    r = _bench_cmd("--plot", str(tmp_path / "nope" / "chart.png"), env={"PYTHONPATH": str(tmp_path / "stub")})
    assert r.returncode == 2 and "round " not in r.stderr, r.stderr


def test_configuration_error_stops_bench_before_measuring():
    r = _bench_cmd("--quick", env={"UMP_ALLOC_LIMIT": "64K"})
    assert r.returncode == 2, r.stdout + r.stderr
    assert "configuration error: UMP_ALLOC_LIMIT=\"64K\"" in r.stderr and "round " not in r.stderr, r.stderr


def test_numpy_workloads_write_and_read_every_array():
    """The 64 MiB row of the old bench wrote one float per 4 KiB page (a[::512] = 1.0) and
    claimed 56-249x; every workload now fills its arrays (zeros, ones, arange, ufunc outputs)
    and reads them back (sum, max, ufunc inputs)."""
    src = _bench.NUMPY_WORKLOADS
    assert "[::512]" not in src and "np.empty(" not in src
    for name in ("small", "medium", "large", "resize"):
        assert f"def {name}()" in src


def test_numpy_bench_runs_the_same_workloads():
    """benches/numpy_bench.py and `python -m ump_alloc bench` run the same workloads, so their
    NumPy numbers measure the same thing (the bench takes the text from the public
    ``ump_alloc.bench``)."""
    import importlib.util

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "benches", "numpy_bench.py")
    if not os.path.exists(path):
        pytest.skip("not a checkout")
    spec = importlib.util.spec_from_file_location("numpy_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert _bench.NUMPY_WORKLOADS in module.WORKER
    assert module.NUMPY_WORKLOADS == _bench.NUMPY_WORKLOADS


def test_runs_not_on_the_allocator_they_name_stop_the_bench(monkeypatch, capsys):
    """UMP_ALLOC=1 without ump_alloc.pth switches nothing on: the comparison would be the
    default with itself. The bench refuses up front, and each run checks what it measured."""
    from ump_alloc import _enable

    monkeypatch.setattr(_enable, "pth_installed", lambda: False)
    assert _bench.main(["--quick"]) == 2
    assert "needs ump_alloc.pth in site-packages" in capsys.readouterr().err
    monkeypatch.setitem(_bench._WORKERS, "numpy", "import json; print(json.dumps({'x (ms)': 1.0, 'on ump-alloc': False}))")
    with pytest.raises(RuntimeError, match="the UMP_ALLOC=1 run allocated from its default allocator"):
        _bench._run("numpy", True, True)
    assert _bench._run("numpy", False, True) == {"x (ms)": 1.0}  # control: a default run that is


@pytest.mark.gpu
def test_bench_gpu_rows_measure_both_allocators():
    """On a GPU: the CuPy and PyTorch rows run in both settings (each run checked its allocator:
    CuPy's pool and PyTorch's caching allocator by default, ump-alloc under UMP_ALLOC=1), the
    GPU result read by NumPy is verified element by element in every run (fresh values per
    repetition), and every value is a measurement."""
    r = _bench_cmd("--quick", "--json", "--rounds", "4", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert out["gpu"], out
    names = {row["name"]: row for row in out["rows"]}
    wanted = ["cupy.asarray, 64 MiB (GB/s)", "cupy.asnumpy, 64 MiB (GB/s)",
              "GPU result read by NumPy: ump_alloc.asnumpy + max, 64 MiB (ms)",
              "pipeline NumPy -> GPU -> NumPy, 64 MiB (ms)", "CuPy alloc+free 4 KiB (ns)", "CuPy alloc+free 1 MiB (ns)"]
    try:
        import torch

        if torch.cuda.is_available():
            wanted += ["PyTorch empty+free 4 KiB (ns)", "PyTorch empty+free 1 MiB (ns)", "PyTorch .cpu(), 64 MiB (GB/s)"]
    except ImportError:
        pass
    for name in wanted:
        row = names.get(name)
        assert row is not None, (name, sorted(names), out["skipped"])
        assert len(row["default_runs"]) == 4 and len(row["ump_runs"]) == 4, row
        assert all(v > 0 for v in row["default_runs"] + row["ump_runs"]), row
        assert row["better"] != "-" and row["better"] != "too few rounds for a verdict", row
