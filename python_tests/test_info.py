"""`info` and the configuration tell the truth (issue 23): `info` gives the verdict a program
run with UMP_ALLOC=1 gets, hints are whole sentences, `enable()`'s errors name its keywords,
limits too small to serve anything are refused, a wrong UMP_ALLOC_LIBRARY is one clear line,
`info` shows what each value means, and the warning about an unknown variable points at the
program's own line."""

import ctypes
import json
import os
import subprocess
import sys

import pytest
from conftest import GPU, run_python

import ump_alloc
from ump_alloc import _enable


def _env(extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    e.update(extra)
    return e


def _info(extra):
    return subprocess.run([sys.executable, "-m", "ump_alloc", "info"], capture_output=True, text=True,
                          env=_env(extra), timeout=120)


def _program(extra, code="import numpy as np\nprint('ran', np.zeros(6).sum())"):
    """A program run with UMP_ALLOC=1 and `extra`: (ran, the UmpError's message or None)."""
    r = run_python(code, env={"UMP_ALLOC": "1", **extra}, check=False)
    err = None
    for line in r.stderr.splitlines():
        if line.startswith("ump_alloc._lib.UmpError: "):
            err = line[len("ump_alloc._lib.UmpError: "):]
    return r.returncode == 0 and "ran" in r.stdout, err, r


def _pth():
    if not _enable.pth_installed():
        pytest.skip("ump_alloc.pth is not in site-packages (run through scripts/test.sh)")


# Settings this machine cannot do (no GPU here) and, as controls, settings it can.
NO_GPU_REFUSED = [
    {"UMP_ALLOC_MODE": "managed"},
    {"UMP_ALLOC_MODE": "pinned"},
    {"UMP_ALLOC_MODE": "system"},
    {"UMP_ALLOC_MODE": "device"},
    {"UMP_ALLOC_MODE": "registered"},
    {"UMP_ALLOC_HOST_SIDE": "pinned"},
    {"UMP_ALLOC_DEVICE_SIDE": "managed"},
]
ANYWHERE = [
    ({"UMP_ALLOC_LIMIT": "64K"}, False),
    ({"UMP_ALLOC_ALIGNMENT": "3"}, False),
    ({}, True),
    ({"UMP_ALLOC_MODE": "host"}, True),
    ({"UMP_ALLOC_LIMIT": "64M"}, True),
    # One rule for both byte limits (issue 37): a pinned cap of 1 byte was accepted.
    ({"UMP_ALLOC_PINNED_LIMIT": "1"}, False),
    ({"UMP_ALLOC_PINNED_LIMIT": "64M"}, True),
]


@pytest.mark.parametrize(
    "extra, works",
    [(e, False) for e in NO_GPU_REFUSED] + ANYWHERE,
    ids=lambda x: ",".join(f"{k}={v}" for k, v in x.items()) if isinstance(x, dict) else None,
)
def test_info_gives_the_verdict_the_program_gets(extra, works):
    _pth()
    if GPU and extra in NO_GPU_REFUSED:
        pytest.skip("a GPU is here: these settings work")
    ran, err, r = _program(extra)
    info = _info(extra)
    assert ran == works, (r.returncode, r.stdout, r.stderr)
    assert info.returncode == (0 if works else 2), info.stdout + info.stderr
    if works:
        assert "configuration error" not in info.stdout, info.stdout
        return
    # The same message in both places: info's line and the program's UmpError.
    line = next(x for x in info.stdout.splitlines() if x.startswith("configuration error: "))
    message = line[len("configuration error: "):]
    assert err is not None and err.endswith(
        f"ump_init: {message}. Fix the setting (python -m ump_alloc info shows them all), or unset UMP_ALLOC "
        "to run without ump-alloc."), (err, message)
    assert "Mode: none: this configuration cannot start ump-alloc" in info.stdout, info.stdout
    assert "would be chosen" not in info.stdout
    assert info.stderr.strip() == line, info.stderr


@pytest.mark.skipif(GPU, reason="needs a machine without a GPU")
def test_device_side_hint_is_a_sentence():
    r = _info({"UMP_ALLOC_DEVICE_SIDE": "managed"})
    line = next(x for x in r.stdout.splitlines() if x.startswith("configuration error: "))
    assert "use (" not in line, line
    assert line.endswith("; unset UMP_ALLOC_DEVICE_SIDE (or set it to auto): without a usable GPU there is no "
                         "device side"), line


@pytest.mark.skipif(GPU, reason="needs a machine without a GPU")
def test_enable_errors_name_the_keyword():
    r = run_python(
        "import ump_alloc\n"
        "for kw in ({'mode': 'managed'}, {'limit': '64K'}, {'alignment': 3}, {'mode': 'bogus'}):\n"
        "    try:\n"
        "        ump_alloc.enable(**kw)\n"
        "    except ump_alloc.UmpError as e:\n"
        "        print(e)\n"
    )
    lines = r.stdout.splitlines()
    assert len(lines) == 4, r.stdout
    mode, limit, alignment, bogus = lines
    assert mode.startswith("enable(mode='managed'): mode 'managed' is not available on this machine: no usable GPU"), mode
    assert mode.endswith('; use mode="host" (or mode="auto")'), mode
    assert "UMP_ALLOC" not in mode and "ump_set_mode" not in mode, mode
    assert limit.startswith("enable(limit='64K'): ") and "below the minimum of 64M" in limit, limit
    assert alignment == "enable(alignment=3): alignment 3 is not a power of two", alignment
    assert bogus.startswith("enable(mode='bogus'): \"bogus\": unknown mode"), bogus
    # The same mode from the environment names the variable.
    r = run_python("import ump_alloc\ntry:\n    ump_alloc.enable()\nexcept ump_alloc.UmpError as e:\n    print(e)\n",
                   env={"UMP_ALLOC_MODE": "managed"})
    assert "use UMP_ALLOC_MODE=host (or auto)" in r.stdout, r.stdout


@pytest.mark.parametrize("limit", ["1", "64K", "128K", "63M"])
def test_limits_too_small_to_serve_anything_are_refused(limit):
    _pth()
    ran, err, r = _program({"UMP_ALLOC_LIMIT": limit})
    assert not ran, r.stdout
    assert err is not None and f'UMP_ALLOC_LIMIT="{limit}": ' in err and "below the minimum of 64M" in err, r.stderr
    assert "Unable to allocate" not in r.stderr, "the limit was accepted, then failed an allocation"
    r = run_python(f"import ump_alloc\ntry:\n    ump_alloc.enable(limit={limit!r})\nexcept ump_alloc.UmpError as e:\n    print(e)")
    assert "below the minimum of 64M" in r.stdout, r.stdout


def test_the_minimum_limit_serves_numpy():
    """Control: one arena (64M) is accepted and NumPy works under it, up to the limit."""
    _pth()
    ran, err, r = _program({"UMP_ALLOC_LIMIT": "64M"},
                           "import numpy as np, ump_alloc\n"
                           "a = [np.ones(n) for n in (6, 1000, 100_000)]\n"
                           "print('ran', ump_alloc.is_enabled(), sum(x.sum() for x in a))\n"
                           "try:\n    np.ones(80 << 20, np.uint8)\nexcept MemoryError:\n    print('refused')\n")
    assert ran and err is None, r.stderr
    assert "ran True 101006.0" in r.stdout and "refused" in r.stdout, r.stdout


def _foreign_library():
    import _ctypes

    path = getattr(_ctypes, "__file__", None)
    if not path or not path.endswith(".so"):
        pytest.skip("no shared library at hand that is not ump-alloc's")
    return path


def test_library_that_is_not_ours_is_one_clear_line(tmp_path):
    other = _foreign_library()
    text = tmp_path / "libump_alloc.so"
    text.write_text("not a library\n")
    for path, what in ((other, "is not libump_alloc: it exports none of its functions (no ump_malloc)"),
                       (str(text), "cannot be loaded")):
        info = _info({"UMP_ALLOC_LIBRARY": path})
        assert info.returncode == 2, info.stdout + info.stderr
        assert f"configuration error: UMP_ALLOC_LIBRARY={path!r} {what}" in info.stdout, info.stdout
        lines = info.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"ump_alloc: UMP_ALLOC_LIBRARY={path!r} {what}"), info.stderr
        assert "unset it to load the packaged one" in lines[0], lines[0]
        r = run_python("import ump_alloc\nump_alloc.enable()", env={"UMP_ALLOC_LIBRARY": path}, check=False)
        assert r.returncode == 1 and "Traceback" in r.stderr
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ump_alloc._lib.UmpError: UMP_ALLOC_LIBRARY={path!r} {what}"), r.stderr
        assert "AttributeError" not in r.stderr and "OSError" not in r.stderr, r.stderr


def test_info_without_a_library_still_shows_the_configuration():
    """``info`` with a library that cannot be loaded prints the error with its fix, the
    UMP_ALLOC* variables set (as typed: the table of defaults and meanings is the library's) and
    the verdict, and exits 2 with the error on standard error (it printed one line and no
    table, while the program's own error says that info shows them all)."""
    r = _info({"UMP_ALLOC_LIBRARY": "/nonexistent", "UMP_ALLOC_LIMIT": "8G", "UMP_ALLOC_MODE": "host"})
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[0] == f"ump-alloc {ump_alloc.__version__}  library: cannot be loaded", out
    error = "UMP_ALLOC_LIBRARY='/nonexistent' does not exist; point UMP_ALLOC_LIBRARY at the libump_alloc.so"
    assert out[1].startswith(f"configuration error: {error}") and "unset it to load the packaged one" in out[1], out
    assert "  UMP_ALLOC_LIBRARY = /nonexistent" in out and "  UMP_ALLOC_LIMIT   = 8G" in out, r.stdout
    assert "  UMP_ALLOC_MODE    = host" in out, r.stdout
    assert "Mode: none: ump-alloc cannot start without its library" in r.stdout
    assert "What this means here:" in r.stdout and "ump-alloc will not start" in r.stdout
    assert r.stderr.strip() == f"ump_alloc: {out[1][len('configuration error: '):]}", r.stderr
    # The program's own error says the same and sends the user here.
    ran, err, p = _program({"UMP_ALLOC_LIBRARY": "/nonexistent"})
    if _enable.pth_installed():
        assert not ran and err is not None and error in err and "python -m ump_alloc info shows them all" in err, p.stderr


def test_library_missing_newer_functions_names_its_version(tmp_path):
    """A libump_alloc that lacks functions this package declares (another version) is named as
    such; the control (every function present) loads."""
    from ump_alloc import _lib

    assert all(hasattr(ctypes.CDLL(ump_alloc.library_path()), n) for n in _lib.SIGNATURES)
    r = run_python(
        "from ump_alloc import _lib\n"
        "_lib.SIGNATURES['ump_function_of_a_later_version'] = (None, [])\n"
        "try:\n    _lib.lib()\nexcept _lib.UmpError as e:\n    print(e)\n",
        env={"UMP_ALLOC_LIBRARY": ump_alloc.library_path()},
    )
    assert (f"is a libump_alloc {ump_alloc.version()} this package cannot use: it lacks "
            "ump_function_of_a_later_version (a library of another version)") in r.stdout, r.stdout


def test_info_shows_what_each_value_means():
    r = _info({"UMP_ALLOC_LIMIT": "8GB", "UMP_ALLOC_HOST_RETAIN": "1536M", "UMP_ALLOC_PINNED_LIMIT": "25%",
               "UMP_ALLOC_TORCH_UNIFIED": "1", "UMP_ALLOC_MODE": "Host"})
    assert r.returncode == 0, r.stdout + r.stderr
    line = lambda name: next(x for x in r.stdout.splitlines() if x.startswith(f"  {name} "))  # noqa: E731
    assert " = 8GB = 8 GiB (8589934592 bytes) " in line("UMP_ALLOC_LIMIT"), line("UMP_ALLOC_LIMIT")
    assert " = 1536M = 1.5 GiB (1610612736 bytes) " in line("UMP_ALLOC_HOST_RETAIN")
    assert " = 25% = " in line("UMP_ALLOC_PINNED_LIMIT") and " bytes) of " in line("UMP_ALLOC_PINNED_LIMIT")
    assert " = 1 = 1 (on) " in line("UMP_ALLOC_TORCH_UNIFIED")
    assert " = Host " in line("UMP_ALLOC_MODE") and "Host = " not in line("UMP_ALLOC_MODE"), "same value: shown once"
    assert " = (default 256M) " in _info({}).stdout
    out = run_python("import json, ump_alloc; print(json.dumps(ump_alloc.config_table()))", env={"UMP_ALLOC_LIMIT": "8GB"})
    rows = {row["name"]: row for row in json.loads(out.stdout)}
    assert rows["UMP_ALLOC_LIMIT"]["value"] == "8GB" and rows["UMP_ALLOC_LIMIT"]["parsed"] == "8 GiB (8589934592 bytes)"
    assert rows["UMP_ALLOC_ALIGNMENT"]["value"] is None and rows["UMP_ALLOC_ALIGNMENT"]["parsed"] == "512 bytes"


def test_invalid_value_is_marked_in_the_table():
    r = _info({"UMP_ALLOC_LIMIT": "lots"})
    assert r.returncode == 2
    line = next(x for x in r.stdout.splitlines() if x.startswith("  UMP_ALLOC_LIMIT "))
    assert "lots  (invalid: see the configuration error)" in line, line


def _warning_site(tmp_path, source, env):
    script = tmp_path / "prog.py"
    script.write_text(source)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=_env(env), timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "RuntimeWarning: UMP_ALLOC_MODEE is set" in x]
    assert len(lines) == 1, r.stderr
    return lines[0].split(": RuntimeWarning")[0], str(script)


def test_unknown_variable_warning_points_at_the_program(tmp_path):
    _pth()
    site, script = _warning_site(tmp_path, "import os\nx = 1\nimport numpy\n", {"UMP_ALLOC": "1", "UMP_ALLOC_MODEE": "host"})
    assert site == f"{script}:3", site
    site, script = _warning_site(tmp_path, "import ump_alloc\n\nump_alloc.enable(cupy=False, torch=False)\n",
                                 {"UMP_ALLOC_MODEE": "host"})
    assert site == f"{script}:3", site
    site, script = _warning_site(tmp_path, "import ump_alloc\nwith ump_alloc.enabled(cupy=False, torch=False):\n    pass\n",
                                 {"UMP_ALLOC_MODEE": "host"})
    assert site == f"{script}:2", site


@pytest.mark.parametrize("setting, huge", [
    ("always [madvise] never\n", True),
    ("[always] madvise never\n", True),
    ("always madvise [never]\n", False),
    (None, False),
])
def test_info_explains_the_page_sizes_of_plain_host_memory(tmp_path, setting, huge):
    """`private_pages` reads the kernel's THP setting and says what plain host memory gets: huge
    pages for large blocks (as NumPy asks) and small pages for the arenas of small blocks (as
    glibc's heap) where the kernel has huge pages at all; `info` prints it for the host side."""
    from ump_alloc.__main__ import THP, private_pages

    path = tmp_path / "enabled"
    if setting is not None:
        path.write_text(setting)
    line = private_pages(str(path))
    assert ("huge pages for blocks of 4 MiB or more" in line) == huge, line
    assert line.startswith("4 KiB pages") == (not huge), line
    out = run_python("import sys, ump_alloc.__main__ as m; sys.argv = ['ump_alloc', 'info']; sys.exit(m.main())",
                     env={"UMP_ALLOC_HOST_SIDE": "host", "UMP_ALLOC_NO_CUDA": "1"}, check=False).stdout
    assert f"pages: {private_pages(THP)}" in out, out
