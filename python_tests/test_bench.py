"""python -m ump_alloc bench: runs the host part without a GPU, says so, and the JSON, table and
chart carry real measurements of both allocators."""

import json
import subprocess
import sys

import pytest


def test_bench_quick_json_measures_both_allocators():
    r = subprocess.run([sys.executable, "-m", "ump_alloc", "bench", "--quick", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    names = {row["name"]: row for row in out["rows"]}
    small = names["numpy small arrays (alloc+free, ns)"]
    assert small["default"] > 0 and small["ump"] > 0 and small["better"] != "-"
    if not out["gpu"]:
        assert any("no CUDA GPU" in s for s in out["skipped"])
    assert "[2/" in r.stderr or "ump-alloc bench" in r.stderr, "no progress shown"


def test_bench_table_and_plot(tmp_path):
    from ump_alloc import _bench

    result = {"rows": [{"name": "x (GB/s)", "default": 2.0, "ump": 4.0, "better": _bench._better("x (GB/s)", 2.0, 4.0)},
                       {"name": "y (ns)", "default": 100.0, "ump": 200.0, "better": _bench._better("y (ns)", 100.0, 200.0)}],
              "skipped": ["torch: not installed"], "gpu": False, "quick": True, "python": "3", "time": "now"}
    text = _bench.table(result)
    assert "ump 2.00x" in text and "default 2.00x" in text and "not measured: torch" in text
    assert "only the host part ran" in text
    pytest.importorskip("matplotlib")
    png = tmp_path / "b.png"
    _bench.plot(result, str(png))
    assert png.read_bytes()[:4] == b"\x89PNG"
