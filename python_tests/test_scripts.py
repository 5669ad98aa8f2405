"""scripts/setup.sh (which demo.sh and test.sh run first) says what it is doing: one line per
step, so that a first run, which spends a minute or more in pip and cargo, does not look hung
(issue 37). Run here with stand-ins for Python, pip and cargo: the lines and the order of the
steps are checked, not PyPI."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETUP = os.path.join(ROOT, "scripts", "setup.sh")
if not os.path.exists(SETUP):
    pytest.skip("not a checkout (the device runs a staged copy of python/ and python_tests/)", allow_module_level=True)

# A stand-in interpreter: `-m venv DIR` makes DIR/bin/python (a copy of itself); anything else
# (pip) is logged, and prints what pip prints unless it is told to be quiet (-q).
STAND_IN_PYTHON = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "Python $STAND_IN_VERSION"; exit 0; fi
if [ "$1" = "-c" ]; then [ "$STAND_IN_VERSION" != 3.8.18 ]; exit; fi  # the version check
echo "$0 $*" >> "$SETUP_LOG"
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
case " $* " in *" -q "*) ;; *) echo "Collecting numpy (pip noise)" ;; esac
"""


def _run(tmp_path, version="3.11.7", ok=True):
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True, exist_ok=True)
    shutil.copy(SETUP, checkout / "scripts" / "setup.sh")
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    for name, text in (("python3", STAND_IN_PYTHON), ("cargo", "#!/bin/sh\nexit 0\n")):
        (bindir / name).write_text(text)
        (bindir / name).chmod(0o755)
    log = tmp_path / "log"
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin", "SETUP_LOG": str(log), "HOME": str(tmp_path),
           "STAND_IN_VERSION": version}
    r = subprocess.run(["bash", str(checkout / "scripts" / "setup.sh")], capture_output=True, text=True, env=env,
                       timeout=60)
    if not ok:
        return r
    assert r.returncode == 0, r.stdout + r.stderr
    calls = log.read_text().splitlines()
    log.unlink()
    return r.stdout.splitlines(), calls


def test_setup_says_each_step_and_only_that(tmp_path):
    lines, calls = _run(tmp_path)
    assert lines == [
        "setup: creating .venv (python3 -m venv) and upgrading its pip",
        "setup: installing numpy, numpy_allocator, pytest and dask from PyPI into .venv (first run only, "
        "about a minute)",
        "setup: building the Rust library (cargo build --release) and installing ump-alloc into .venv",
        "setup: done",
    ], lines
    assert "pip noise" not in "\n".join(lines)
    # The steps, in that order: the venv, pip's upgrade, the requirements, the package.
    assert [c.split(" ", 1)[1].split(" -q ")[0] for c in calls] == [
        "-m venv .venv", "-m pip install", "-m pip install", "-m pip install"], calls
    assert "--upgrade pip" in calls[1] and "numpy>=1.22" in calls[2] and calls[3].endswith(" --force-reinstall --no-deps ."), calls


def test_a_later_run_says_it_only_checks(tmp_path):
    _run(tmp_path)
    lines, calls = _run(tmp_path)
    assert lines == [
        "setup: checking numpy, numpy_allocator, pytest and dask in .venv",
        "setup: building the Rust library (cargo build --release) and installing ump-alloc into .venv",
        "setup: done",
    ], lines
    assert len(calls) == 2 and not any("venv" in c.split(" ", 1)[1][:8] for c in calls), calls


def test_an_old_python_is_refused_before_anything_is_installed(tmp_path):
    """Python 3.8: one line that says what is needed, before any venv or pip (on 3.7/3.8 pip
    can spend minutes building an old NumPy before it fails)."""
    r = _run(tmp_path, version="3.8.18", ok=False)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.strip() == ("setup: Python >= 3.9 is required; python3 is Python 3.8.18 "
                                "(PYTHON=python3.X chooses another)"), r.stderr
    assert not (tmp_path / "log").exists() and not (tmp_path / "checkout" / ".venv").exists()
