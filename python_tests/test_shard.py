"""``--shard I/N`` (conftest.py): the GPU suite in parts, each under the device tool's ten-minute
limit per call. Every test lands in exactly one part."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _collect(tmp_path, *args):
    (tmp_path / "conftest.py").write_text(
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('ump_conftest', {os.path.join(HERE, 'conftest.py')!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "pytest_addoption, pytest_collection_modifyitems = m.pytest_addoption, m.pytest_collection_modifyitems\n")
    (tmp_path / "test_many.py").write_text("import pytest\n\n@pytest.mark.parametrize('i', range(7))\ndef test_x(i):\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                       cwd=tmp_path, capture_output=True, text=True)
    return r, [line for line in r.stdout.splitlines() if "::" in line]


def test_the_parts_cover_every_test_once(tmp_path):
    _, whole = _collect(tmp_path)
    assert len(whole) == 7
    parts = [_collect(tmp_path, "--shard", f"{i}/3")[1] for i in range(3)]
    assert sorted(sum(parts, [])) == sorted(whole)
    assert [len(p) for p in parts] == [3, 2, 2]


def test_a_bad_shard_is_refused_with_the_form(tmp_path):
    r, _ = _collect(tmp_path, "--shard", "3/3")
    assert r.returncode != 0 and "give I/N with 0 <= I < N" in r.stderr + r.stdout
