"""Configuration and enabling, each in a fresh interpreter (configuration is read once)."""

import os
import subprocess
import sys

import pytest

import ump_alloc
from conftest import GPU, ROOT, run_python


def test_alignment_from_environment():
    r = run_python(
        "import numpy as np, ump_alloc; ump_alloc.enable();"
        "xs=[np.empty(n, np.uint8) for n in (1, 100, 4096, 5000, 10**6)];"
        "print(ump_alloc.alignment(), all(x.ctypes.data % 4096 == 0 for x in xs[2:]),"
        " [ump_alloc.block_alignment(x.nbytes) for x in xs])",
        env={"UMP_ALLOC_ALIGNMENT": "4096"},
    )
    assert r.stdout.strip().split(maxsplit=2) == ["4096", "True", "[16, 16, 4096, 4096, 4096]"]


@pytest.mark.parametrize("bad", ["3", "8", "100", "abc", "1048576"])
def test_bad_alignment_is_a_clear_error(bad):
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_ALIGNMENT": bad}, check=False)
    assert r.returncode != 0
    assert "UMP_ALLOC_ALIGNMENT" in r.stderr and bad in r.stderr


def test_bad_mode_name():
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_MODE": "turbo"}, check=False)
    assert r.returncode != 0 and "UMP_ALLOC_MODE" in r.stderr and "managed" in r.stderr


@pytest.mark.skipif(GPU, reason="checks the CPU-only behaviour")
@pytest.mark.parametrize("mode", ["system", "managed", "registered", "device"])
def test_gpu_mode_without_gpu_is_a_clear_error(mode):
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_MODE": mode}, check=False)
    assert r.returncode != 0
    assert f"mode '{mode}' is not available" in r.stderr and "UMP_ALLOC_MODE=host" in r.stderr


def test_no_cuda_switch_forces_host():
    r = run_python("import ump_alloc; ump_alloc.enable(); print(ump_alloc.mode())", env={"UMP_ALLOC_NO_CUDA": "1"})
    assert r.stdout.strip() == "host"


def test_mode_and_alignment_fixed_at_first_allocation():
    r = run_python(
        "import numpy as np, ump_alloc\n"
        "ump_alloc.enable(alignment=1024)\n"
        "a = np.ones(1000)\n"
        "assert a.ctypes.data % 1024 == 0\n"
        "ump_alloc.enable(alignment=1024)  # same value: fine\n"
        "try:\n"
        "    ump_alloc.enable(alignment=2048)\n"
        "except ump_alloc.UmpError as e:\n"
        "    print('LOCKED' if e.status_name == 'UMP_ERR_LOCKED' else e.status_name, e)\n"
        "try:\n"
        "    ump_alloc.enable(mode='managed')\n"
        "except ump_alloc.UmpError as e:\n"
        "    print(e.status_name)\n",
        env={"UMP_ALLOC_NO_CUDA": "1"},
    )
    lines = r.stdout.splitlines()
    assert lines[0].startswith("LOCKED") and "1024" in lines[0]
    assert lines[1] in ("UMP_ERR_LOCKED", "UMP_ERR_UNSUPPORTED")


def _pth_installed():
    import site

    dirs = site.getsitepackages() + [site.getusersitepackages()]
    return any(os.path.exists(os.path.join(d, "ump_alloc.pth")) for d in dirs)


@pytest.mark.skipif(not _pth_installed(), reason="needs the installed package (pip install .)")
def test_ump_alloc_env_enables_without_code_change():
    r = run_python(
        "import numpy as np, threading, ump_alloc\n"
        "a = np.arange(1000)\n"
        "out = []\n"
        "t = threading.Thread(target=lambda: out.append(ump_alloc.handles(np.ones(5)))); t.start(); t.join()\n"
        "print(ump_alloc.handles(a), a.ctypes.data % 512 == 0, out[0])",
        env={"UMP_ALLOC": "1"},
    )
    assert r.stdout.split() == ["True", "True", "True"]


def test_without_env_nothing_changes():
    r = run_python("import numpy as np, ump_alloc; print(ump_alloc.handles(np.arange(10)))")
    assert r.stdout.strip() == "False"


def test_library_override(tmp_path):
    lib = ump_alloc.library_path()
    r = run_python("import ump_alloc; print(ump_alloc.library_path())", env={"UMP_ALLOC_LIBRARY": lib})
    assert r.stdout.strip() == os.path.abspath(lib)
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_LIBRARY": str(tmp_path / "nope.so")}, check=False)
    assert r.returncode != 0 and "UMP_ALLOC_LIBRARY" in r.stderr


def test_info_and_demo_commands():
    env = {k: v for k, v in os.environ.items() if not k.startswith("UMP_ALLOC") or k == "UMP_ALLOC_LIBRARY"}
    info = subprocess.run([sys.executable, "-m", "ump_alloc", "info"], capture_output=True, text=True, env=env, timeout=120)
    assert info.returncode == 0, info.stderr
    for name in ["UMP_ALLOC_MODE", "UMP_ALLOC_ALIGNMENT", "UMP_ALLOC_LIMIT", "Mode:"]:
        assert name in info.stdout
    demo = subprocess.run([sys.executable, "-m", "ump_alloc", "demo"], capture_output=True, text=True, env=env, timeout=300)
    assert demo.returncode == 0, demo.stderr
    assert "handles(a) = True" in demo.stdout and "% 512 = 0" in demo.stdout
    if not GPU:
        assert "No GPU found" in demo.stdout


def test_capabilities_shape():
    c = ump_alloc.capabilities()
    assert c["version"] == 3
    assert c["host_side"] in ("host", "system", "pinned", "managed") and c["host_reason"]
    assert c["device_side"] in ("none", "system", "managed", "pinned", "device") and c["device_reason"]
    assert c["alignment"] >= 16
    assert c["mode"] in ("host", "system", "managed", "registered", "device", "pinned", "custom")
    assert c["mode_reason"]
    assert c["device_count"] == len(c["devices"])
    assert c["fork_rule"] and isinstance(c["fork_shared"], bool)
    if c["host_side"] != "pinned":
        assert not c["fork_shared"]
    if not GPU:
        assert not c["cuda_available"] and c["mode"] == "host"
        assert c["fork_rule"].startswith("copy-on-write"), c["fork_rule"]


def test_config_table_lists_every_variable():
    names = [r["name"] for r in ump_alloc.config_table()]
    for n in ["UMP_ALLOC", "UMP_ALLOC_MODE", "UMP_ALLOC_ALIGNMENT", "UMP_ALLOC_LIMIT", "UMP_ALLOC_LIBRARY"]:
        assert n in names
    assert ump_alloc.last_error() is None


def test_sides_are_validated_and_shown():
    # No GPU here: a GPU side is refused with the fix named; a bad value names the variable.
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_NO_CUDA": "1", "UMP_ALLOC_HOST_SIDE": "pinned"},
                   check=False)
    assert r.returncode != 0 and "host side 'pinned' is not available" in r.stderr
    assert "UMP_ALLOC_HOST_SIDE=host" in r.stderr
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_DEVICE_SIDE": "gpu"}, check=False)
    assert r.returncode != 0 and "UMP_ALLOC_DEVICE_SIDE" in r.stderr
    r = run_python("import ump_alloc; ump_alloc.enable()", env={"UMP_ALLOC_PINNED_LIMIT": "200%"}, check=False)
    assert r.returncode != 0 and "UMP_ALLOC_PINNED_LIMIT" in r.stderr
    r = run_python("import ump_alloc.__main__ as m; m.main(['info'])", env={"UMP_ALLOC_NO_CUDA": "1"})
    assert "host side (NumPy):            host" in r.stdout
    assert "device side (CuPy, PyTorch):  none" in r.stdout
    for var in ("UMP_ALLOC_HOST_SIDE", "UMP_ALLOC_DEVICE_SIDE", "UMP_ALLOC_PINNED_LIMIT"):
        assert var in r.stdout


def test_capabilities_before_the_first_allocation_show_the_api_settings():
    # ump_set_mode / ump_set_alignment before the first allocation are what init will use, and
    # what ump_config_check judges: ump_capabilities must describe the same (it described the
    # environment's request instead). The environment asks for a mode that fails without a GPU
    # (and that differs from 'host' with one), the API for 'host'.
    r = run_python(
        "import ump_alloc\n"
        "from ump_alloc import _lib\n"
        "L = _lib.lib()\n"
        "assert L.ump_set_mode(b'host') == 0 and L.ump_set_alignment(4096) == 0\n"
        "c = ump_alloc.capabilities()\n"
        "print(c['mode'], c['alignment'], c['host_side'], c['fork_shared'], L.ump_config_check())\n"
        "print(c['mode_reason'])\n",
        env={"UMP_ALLOC_MODE": "managed", "UMP_ALLOC_ALIGNMENT": "256"},
    )
    first, reason = r.stdout.splitlines()
    assert first.split() == ["host", "4096", "host", "False", "0"], r.stdout
    assert "not available" not in reason, reason


def test_setting_reads_a_variable_through_the_library_table():
    """``_config.setting`` is the package's one reading of a variable: the table's default
    where unset, the value as typed where set, the table's own message where refused."""
    code = (
        "import json, os, ump_alloc\n"
        "from ump_alloc import _config, _torch, _numpy\n"
        "out = {'route': _torch.route_setting(), 'numpy': _numpy.route(),\n"
        "       'zero_copy': _config.setting('UMP_ALLOC_CUPY_ZERO_COPY')}\n"
        "os.environ['UMP_ALLOC_TORCH_ROUTE'] = ' SWAP '\n"
        "out['swap'] = _torch.route_setting()\n"
        "os.environ['UMP_ALLOC_TORCH_ROUTE'] = 'pluggable'\n"
        "try:\n"
        "    _torch.route_setting()\n"
        "except ump_alloc.UmpError as e:\n"
        "    out['error'] = [str(e), e.status_name]\n"
        "try:\n"
        "    _config.setting('UMP_ALLOC_NO_SUCH')\n"
        "except ump_alloc.UmpError as e:\n"
        "    out['unknown'] = e.status_name\n"
        "os.environ['UMP_ALLOC_NUMPY_ROUTE'] = 'numba'\n"
        "out['numpy_bad'] = _numpy.route()\n"
        "out['check'] = _config.config_errors()\n"
        "print(json.dumps(out))\n"
    )
    import json

    out = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert out["route"] == "segments" and out["numpy"] == "native" and out["zero_copy"] == "0", out
    assert out["swap"] == "swap", out
    msg, status = out["error"]
    assert status == "UMP_ERR_CONFIG", out
    # The table's text, naming the variable, the value and what it takes, and the fix.
    assert msg.startswith('UMP_ALLOC_TORCH_ROUTE="pluggable": expected segments or swap'), msg
    assert "unset it" in msg, msg
    assert out["unknown"] == "UMP_ERR_INVALID", out
    # A refused NumPy route reads as the default here; the configuration check says why.
    assert out["numpy_bad"] == "native", out
    assert any('UMP_ALLOC_TORCH_ROUTE="pluggable"' in line for line in out["check"]), out["check"]


def test_the_package_reads_no_setting_around_the_table():
    """Every ``UMP_ALLOC_*`` variable the package acts on is read through the library's table
    (``_config.setting``), except the two that must be read before the library is loaded:
    ``UMP_ALLOC`` (the start-up hook) and ``UMP_ALLOC_LIBRARY`` (which library to load)."""
    import re

    pkg = os.path.join(ROOT, "python")
    read = re.compile(r"""(?:environ\.get\(|environ\[|getenv\()\s*f?["'](UMP_ALLOC\w*)["']""")
    found = []
    for d, _, files in os.walk(pkg):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(d, f)
                with open(path) as fh:
                    for n, line in enumerate(fh, 1):
                        for name in read.findall(line):
                            if name not in ("UMP_ALLOC", "UMP_ALLOC_LIBRARY"):
                                found.append(f"{os.path.relpath(path, ROOT)}:{n}: {name}")
    assert not found, found
