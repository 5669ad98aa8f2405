"""Configuration and errors that never mislead (issue 13 item 5): UMP_ALLOC=1 imports nothing at
start-up, a bad setting stops the program at NumPy's import (never a silent run on NumPy's own
allocator), strict switch values, misspelled variables, `info`'s exit status and summary, and the
note on an allocation refused by UMP_ALLOC_LIMIT."""

import os
import subprocess
import sys

import pytest
from conftest import run_python

import ump_alloc
from ump_alloc import _enable


def _pth():
    if not _enable.pth_installed():
        pytest.skip("ump_alloc.pth is not in site-packages (run through scripts/test.sh)")


def test_startup_imports_nothing_until_numpy():
    _pth()
    code = (
        "import sys\n"
        "print('start:', sorted(sys.modules))\n"
        "import ump_alloc\n"
        "print('ump_alloc alone:', 'numpy' in sys.modules)\n"
        "import numpy, ump_alloc\n"
        "print('after numpy:', ump_alloc.is_enabled())\n"
    )

    def start(out):
        line = next(x for x in out.splitlines() if x.startswith("start: "))
        return set(eval(line[len("start: "):]))

    on = run_python(code, env={"UMP_ALLOC": "1"})
    off = run_python(code)  # the control: what this interpreter imports anyway (other .pth files)
    added = start(on.stdout) - start(off.stdout)
    assert added <= {"_ump_alloc_hooks", "__future__"}, sorted(added)
    assert not {"numpy", "ump_alloc", "ctypes"} & start(on.stdout)
    assert "ump_alloc alone: False" in on.stdout, on.stdout
    assert "after numpy: True" in on.stdout, on.stdout
    assert "after numpy: False" in off.stdout, off.stdout


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"UMP_ALLOC": "1", "UMP_ALLOC_MODE": "bogus"}, 'UMP_ALLOC_MODE="bogus"'),
        ({"UMP_ALLOC": "1", "UMP_ALLOC_ALIGNMENT": "3"}, 'UMP_ALLOC_ALIGNMENT="3"'),
        ({"UMP_ALLOC": "2"}, 'UMP_ALLOC="2"'),
        ({"UMP_ALLOC": "true"}, 'UMP_ALLOC="true"'),
        ({"UMP_ALLOC": "1", "UMP_ALLOC_NO_CUDA": "maybe"}, 'UMP_ALLOC_NO_CUDA="maybe"'),
        ({"UMP_ALLOC": "1", "UMP_ALLOC_LIMIT": "0"}, 'UMP_ALLOC_LIMIT="0"'),
    ],
)
def test_bad_setting_stops_the_program_at_numpy_import(env, needle):
    _pth()
    r = run_python("import numpy\nprint('the program ran')", env=env, check=False)
    assert r.returncode != 0 and "the program ran" not in r.stdout, (r.returncode, r.stdout)
    assert needle in r.stderr and "unset UMP_ALLOC" in r.stderr, r.stderr
    assert "Remainder of file ignored" not in r.stderr
    # Python commands that never import NumPy are not disturbed.
    r = run_python("pass", env=env, check=False)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_ump_alloc_zero_is_off():
    _pth()
    r = run_python("import numpy, ump_alloc\nprint('on:', ump_alloc.is_enabled())", env={"UMP_ALLOC": "0"})
    assert "on: False" in r.stdout


def test_misspelled_variable_warns_with_the_closest_name():
    r = run_python(
        "import warnings, ump_alloc\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    ump_alloc.enable(cupy=False, torch=False)\n"
        "print([str(x.message) for x in w])\n"
        "print(ump_alloc.unknown_variables())\n",
        env={"UMP_ALLOC_MODEE": "host", "UMP_ALLOC_QWERTYUIOP": "1"},
    )
    assert "UMP_ALLOC_MODEE is set but ump-alloc has no such variable; did you mean UMP_ALLOC_MODE?" in r.stdout, r.stdout
    assert "('UMP_ALLOC_QWERTYUIOP', None)" in r.stdout, r.stdout
    # Control: known variables only, no warning.
    r = run_python(
        "import warnings, ump_alloc\nwarnings.simplefilter('error')\nump_alloc.enable(cupy=False, torch=False)\nprint('quiet')",
        env={"UMP_ALLOC_MODE": "host"},
    )
    assert "quiet" in r.stdout


def _info(env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    e.update(env)
    return subprocess.run([sys.executable, "-m", "ump_alloc", "info"], capture_output=True, text=True, env=e, timeout=120)


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"UMP_ALLOC_ALIGNMENT": "3"}, 'UMP_ALLOC_ALIGNMENT="3": 3 is not a power of two'),
        ({"UMP_ALLOC_NO_CUDA": "true"}, 'UMP_ALLOC_NO_CUDA="true": expected 0 or 1'),
        ({"UMP_ALLOC": "2"}, 'UMP_ALLOC="2"'),
        ({"UMP_ALLOC_PINNED_FORK": "shared"}, 'UMP_ALLOC_PINNED_FORK="shared": expected share'),
    ],
)
def test_info_says_configuration_error_and_fails(env, needle):
    r = _info(env)
    assert r.returncode != 0, r.stdout
    assert f"configuration error: {needle}" in r.stdout, r.stdout
    assert "alignment 0 bytes" not in r.stdout
    assert "What this means here:" in r.stdout and "will not start" in r.stdout


def test_info_ends_with_what_it_means():
    r = _info({"UMP_ALLOC_MODEE": "x"})
    assert r.returncode == 0, r.stdout + r.stderr  # a misspelling warns, it does not fail
    assert "warning: UMP_ALLOC_MODEE is set but ump-alloc has no such variable; did you mean UMP_ALLOC_MODE?" in r.stdout
    tail = r.stdout.split("What this means here:")[1]
    for label in ("NumPy", "CuPy", "PyTorch", "Numba", "Dask"):
        assert label in tail, tail
    assert "off until ump_alloc.enable() or UMP_ALLOC=1" in tail
    r = _info({"UMP_ALLOC": "1"})
    assert "UMP_ALLOC=1 is set: switched over as the program imports it" in r.stdout


def test_limit_refusal_names_its_cause_once():
    r = run_python(
        "import numpy as np, ump_alloc\n"
        "ump_alloc.enable(cupy=False, torch=False)\n"
        "for _ in range(3):\n"
        "    try:\n"
        "        np.ones(512 << 20, np.uint8)\n"
        "    except MemoryError as e:\n"
        "        print('MemoryError')\n"
        "print('last:', ump_alloc.last_error())\n",
        env={"UMP_ALLOC_LIMIT": "256M"},
    )
    assert r.stdout.count("MemoryError") == 3, r.stdout
    assert r.stderr.count("UMP_ALLOC_LIMIT of 268435456 bytes reached") == 1, r.stderr
    assert "last: " in r.stdout and "UMP_ALLOC_LIMIT" in r.stdout
    # Control: no limit, no note.
    r = run_python("import numpy as np, ump_alloc\nump_alloc.enable(cupy=False, torch=False)\nnp.ones(512 << 20, np.uint8)")
    assert "UMP_ALLOC_LIMIT" not in r.stderr


def test_command_line_version_and_help():
    r = subprocess.run([sys.executable, "-m", "ump_alloc", "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"ump-alloc {ump_alloc.__version__}", r.stdout
    r = subprocess.run([sys.executable, "-m", "ump_alloc", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout
    assert "``" not in r.stdout and ":func:" not in r.stdout, r.stdout
    top = r.stdout
    for command in ("info", "demo", "stats", "bench"):
        assert f"    {command} " in top, f"--help does not list {command}: {top}"
    r = subprocess.run([sys.executable, "-m", "ump_alloc", "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage:" in r.stdout
    assert "``" not in r.stdout and ":func:" not in r.stdout, r.stdout


@pytest.mark.parametrize("command, says", [
    ("info", "Print every UMP_ALLOC_* variable"),
    ("demo", "a CuPy kernel then changes a NumPy array in place"),
    ("stats", "print ump_alloc.memory_summary()"),
])
def test_each_command_has_its_own_help(command, says):
    """``info --help``, ``demo --help`` and ``stats --help`` say what that command does (they
    printed the top-level help), and run nothing."""
    top = subprocess.run([sys.executable, "-m", "ump_alloc", "--help"], capture_output=True, text=True, timeout=60).stdout
    r = subprocess.run([sys.executable, "-m", "ump_alloc", command, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"usage: python -m ump_alloc {command} [-h]"), r.stdout
    assert says in " ".join(r.stdout.split()), r.stdout
    assert r.stdout != top and "--libdir" not in r.stdout, r.stdout
    assert "Configuration (UMP_ALLOC_*" not in r.stdout and "NumPy on ump-alloc:" not in r.stdout, "the command ran"


def test_info_says_what_fork_children_get():
    """The host side's fork() rule is printed under it: without a GPU, plain memory copied on
    write; UMP_ALLOC_PINNED_FORK is shown with the other variables."""
    r = _info({"UMP_ALLOC_PINNED_FORK": "copy"})
    assert r.returncode == 0, r.stdout + r.stderr
    import re

    assert re.search(r"UMP_ALLOC_PINNED_FORK +=  ?copy ", r.stdout), r.stdout
    host = r.stdout.split("host side (NumPy):")[1].split("device side")[0]
    assert "fork(): " in host, r.stdout
    import ump_alloc

    if ump_alloc.capabilities()["host_side"] == "pinned":
        assert "fork(): copy: fork() copies every pinned page" in host and "UMP_ALLOC_PINNED_FORK=copy" in host
    else:
        assert "fork(): copy-on-write" in host
