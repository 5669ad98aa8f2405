"""Packaging (issue 13): `pip wheel .` gives one py3-none-<platform> wheel holding the plain-named
library, the header and a pkg-config file; built once, it installs into every CPython >= 3.9 found
on this machine (pyenv's 3.9 ... 3.13 here), where `python -m ump_alloc --version/--include/
--libdir` work and a C program compiles and links against it with pkg-config."""

import glob
import os
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cargo_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if shutil.which("cargo") is None:
        pytest.skip("cargo is needed to build the wheel")
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), ROOT],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "deprecat" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    (w,) = glob.glob(str(out / "*.whl"))
    return w


def test_wheel_is_py3_none_with_plain_library_header_and_pkgconfig(wheel):
    name = os.path.basename(wheel)
    assert re.fullmatch(rf"ump_alloc-{re.escape(_cargo_version())}-py3-none-linux_x86_64\.whl", name), name
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in (
        "ump_alloc/libump_alloc.so",
        "ump_alloc/include/ump_alloc.h",
        "ump_alloc/lib/pkgconfig/ump_alloc.pc",
        "ump_alloc/py.typed",
        "ump_alloc/allocators/cupy.py",
        "ump_alloc.pth",
        "_ump_alloc_hooks.py",
    ):
        assert want in names, f"{want} missing from {name}"
    assert not [n for n in names if "cpython" in n], "a file named for one Python version"
    for lic in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert any(n.endswith(lic) for n in names), f"{lic} missing"


def test_library_does_not_depend_on_python(wheel, tmp_path):
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found")
    zipfile.ZipFile(wheel).extract("ump_alloc/libump_alloc.so", tmp_path)
    dyn = subprocess.run(["readelf", "-d", str(tmp_path / "ump_alloc/libump_alloc.so")], capture_output=True, text=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn)
    assert needed and not [n for n in needed if "python" in n], needed


def _pythons():
    found = {}
    roots = [os.path.expanduser("~/.pyenv/versions")]
    for root in roots:
        for exe in sorted(glob.glob(os.path.join(root, "3.*", "bin", "python3"))):
            v = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True).stdout.strip()
            if v and tuple(map(int, v.split("."))) >= (3, 9):
                found.setdefault(v, exe)
    for v in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        exe = shutil.which(f"python{v}")
        if exe:
            found.setdefault(v, exe)
    return found


C_PROGRAM = r"""
#include <stdio.h>
#include <string.h>
#include <ump_alloc.h>

int main(void) {
    double *p = ump_malloc(1000 * sizeof(double));
    if (!p) { fprintf(stderr, "%s\n", ump_last_error()); return 1; }
    for (int i = 0; i < 1000; i++) p[i] = i * 0.5;
    double s = 0;
    for (int i = 0; i < 1000; i++) s += p[i];
    struct ump_identity id;
    memset(&id, 0, sizeof id);
    id.size = sizeof id;
    int rc = ump_identify(p + 10, &id);
    printf("sum %.1f ours %d version %s\n", s, rc == UMP_OK && id.ours, ump_version());
    ump_free(p, 1000 * sizeof(double));
    return 0;
}
"""


def test_one_wheel_installs_into_every_python(wheel, tmp_path):
    pythons = _pythons()
    if len(pythons) < 2:
        pytest.skip(f"only {sorted(pythons)} found; pyenv's 3.9-3.13 check the range")
    version = _cargo_version()
    done = []
    for v, exe in sorted(pythons.items(), key=lambda kv: tuple(map(int, kv[0].split(".")))):
        venv = tmp_path / f"venv{v}"
        r = subprocess.run([exe, "-m", "venv", str(venv)], capture_output=True, text=True)
        if r.returncode != 0:
            continue  # a Python without venv/ensurepip
        py = str(venv / "bin" / "python")
        r = subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check", wheel], capture_output=True, text=True)
        assert r.returncode == 0, f"{v}: {r.stderr}"
        env = {k: val for k, val in os.environ.items() if not k.startswith("UMP_ALLOC") and k != "PYTHONPATH"}
        r = subprocess.run([py, "-m", "ump_alloc", "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == f"ump-alloc {version}", f"{v}: {r.stdout} {r.stderr}"
        inc = subprocess.run([py, "-m", "ump_alloc", "--include"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout.strip()
        libdir = subprocess.run([py, "-m", "ump_alloc", "--libdir"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout.strip()
        assert os.path.isfile(os.path.join(inc, "ump_alloc.h")), f"{v}: {inc}"
        assert os.path.isfile(os.path.join(libdir, "libump_alloc.so")), f"{v}: {libdir}"
        assert str(venv) in libdir, f"{v}: loaded a library outside the venv: {libdir}"
        done.append(v)
    assert len(done) >= 2, done
    # C users: compile and link against the last venv's copy with pkg-config.
    if shutil.which("pkg-config") is None or shutil.which("cc") is None:
        pytest.skip("pkg-config or cc not found (the Python installs above passed)")
    src = tmp_path / "prog.c"
    src.write_text(C_PROGRAM)
    pc = os.path.join(libdir, "lib", "pkgconfig")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "ump_alloc"], capture_output=True, text=True, env={**os.environ, "PKG_CONFIG_PATH": pc}).stdout.split()
    assert flags, "pkg-config found no ump_alloc.pc"
    subprocess.run(["cc", "-std=c11", "-o", str(tmp_path / "prog"), str(src), *flags], check=True)
    env = {k: val for k, val in os.environ.items() if not k.startswith("UMP_ALLOC") and k != "LD_LIBRARY_PATH"}
    env["UMP_ALLOC_NO_CUDA"] = "1"
    out = subprocess.run([str(tmp_path / "prog")], capture_output=True, text=True, env=env, check=True).stdout
    assert out == f"sum 249750.0 ours 1 version {version}\n", out
    print("installed and ran in Python", ", ".join(done))
