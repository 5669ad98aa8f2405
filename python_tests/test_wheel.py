"""Packaging (issues 13 and 23): ``scripts/wheel.sh`` makes one py3-none manylinux2014 wheel
(glibc 2.17) holding the stripped, plain-named library, the header and a pkg-config file; built
once (the slow step), it installs into every CPython >= 3.9 found on this machine (pyenv's
3.9 ... 3.13 here), where NumPy runs on ump-alloc under ``UMP_ALLOC=1`` without numpy_allocator
or a compiler (the oldest NumPy supported, 1.22, on 3.9), ``python -m ump_alloc --version/
--include/--libdir`` work and a C program compiles and links against it with pkg-config. A
source build without cargo stops at once with one line that says to install Rust."""

import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "target", "wheel-tools", "bin")
PLAT = "manylinux2014_x86_64.manylinux_2_17_x86_64"


def _cargo_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """The release wheel and its debug info, built once by scripts/wheel.sh."""
    if shutil.which("cargo") is None:
        pytest.skip("cargo is needed to build the wheel")
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "wheel.sh"), str(out)], capture_output=True, text=True, timeout=3000)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "deprecat" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr
    return out


@pytest.fixture(scope="module")
def wheel(dist):
    (w,) = glob.glob(str(dist / "*.whl"))
    return w


@pytest.fixture(scope="module")
def library(wheel, tmp_path_factory):
    d = tmp_path_factory.mktemp("lib")
    zipfile.ZipFile(wheel).extract("ump_alloc/libump_alloc.so", d)
    return str(d / "ump_alloc" / "libump_alloc.so")


def test_wheel_is_py3_none_manylinux_with_plain_library_header_and_pkgconfig(wheel):
    name = os.path.basename(wheel)
    assert re.fullmatch(rf"ump_alloc-{re.escape(_cargo_version())}-py3-none-{re.escape(PLAT)}\.whl", name), name
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
    assert not [n for n in names if n.endswith(".debug")], "debug info belongs beside the wheel"
    for lic in ("LICENSE-MIT", "LICENSE-APACHE"):
        assert any(n.endswith(lic) for n in names), f"{lic} missing"
    meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [l for l in zipfile.ZipFile(wheel).read(meta).decode().splitlines() if l.startswith("Requires-Dist:")]
    assert "Requires-Dist: numpy>=1.22" in requires, requires
    assert all("extra ==" in l for l in requires if "numpy_allocator" in l), "numpy_allocator must be optional"


def _readelf(*args):
    if shutil.which("readelf") is None:
        pytest.skip("readelf not found")
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def test_library_needs_glibc_2_17_and_no_python(library):
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", _readelf("-d", library))
    assert needed and not [n for n in needed if "python" in n], needed
    allowed = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "libgcc_s.so.1", "ld-linux-x86-64.so.2"}
    assert set(needed) <= allowed, needed
    versions = {tuple(map(int, v.split("."))) for v in re.findall(r"@GLIBC_([0-9.]+)", _readelf("--dyn-syms", library))}
    assert versions and max(versions) <= (2, 17), sorted(versions)


def test_library_is_stripped_and_its_debug_info_kept_beside_the_wheel(library, dist):
    sections = _readelf("-S", library)
    assert ".debug_info" not in sections and ".gnu_debuglink" in sections, sections
    assert os.path.getsize(library) < 2 << 20, os.path.getsize(library)
    debug = dist / "libump_alloc.so.debug"
    assert debug.is_file() and ".debug_info" in _readelf("-S", str(debug))


def test_auditwheel_accepts_it_as_manylinux2014(wheel):
    r = subprocess.run([os.path.join(TOOLS, "auditwheel"), "show", wheel], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"manylinux_2_17_x86_64"' in " ".join(r.stdout.split()), r.stdout


def test_source_build_without_cargo_fails_with_one_line(tmp_path):
    """No cargo anywhere (PATH, ~/.cargo/bin): pip stops at its first step with our one line,
    no traceback, and the source tree gets no build/ and no .egg-info."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for f in filter(None, files.split("\0")):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(src / os.path.dirname(f), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), src / f)
    path = [d for d in os.environ["PATH"].split(os.pathsep) if d and not os.path.exists(os.path.join(d, "cargo"))]
    env = {k: v for k, v in os.environ.items() if k not in ("CARGO", "UMP_BUILD_LIBRARY", "CARGO_HOME", "RUSTUP_HOME")}
    env.update(PATH=os.pathsep.join([os.path.dirname(sys.executable), *path]), HOME=str(tmp_path / "home"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(tmp_path / "out"), str(src)],
        capture_output=True, text=True, env=env, timeout=600,
    )
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    line = "building from source needs Rust's cargo, which was not found"
    assert out.count(line) == 1 and "install Rust (https://rustup.rs)" in out, out
    assert "Traceback" not in out and "Errno 2" not in out, out
    left = [p for p in glob.glob(str(src / "**"), recursive=True) if p.endswith(".egg-info") or os.path.basename(p) == "build"]
    assert not left, left


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


# Runs in each Python's venv under UMP_ALLOC=1: a thread pool made before NumPy is imported,
# NumPy on ump-alloc in it and in the main thread, numpy_allocator not installed.
NUMPY_CHECK = textwrap.dedent(
    """
    import concurrent.futures, sys
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(int).result()
    import numpy as np, ump_alloc
    from ump_alloc import _numpy
    a = np.random.default_rng(0).standard_normal(1_000_000)
    b = pool.submit(lambda: np.sqrt(np.abs(a)) + 1).result()
    z = np.zeros(10_000)
    ok = ump_alloc.handles(a) and ump_alloc.handles(b) and ump_alloc.handles(z) and not z.any()
    ok = ok and abs(float(b.sum()) - float((np.sqrt(np.abs(a)) + 1).sum())) < 1e-6
    try:
        import numpy_allocator  # noqa: F401
        ok = False  # must not be needed, so it is not installed here
    except ImportError:
        pass
    ok = ok and ump_alloc.stats()["errors"]["total"] == 0 and _numpy.route() == "native"
    print(np.__version__, "ok" if ok else "FAILED", ump_alloc.mode())
    """
)


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
        # The oldest NumPy ump-alloc supports (1.22, the first with NEP 49) on the oldest Python.
        numpy = "numpy==1.22.4" if v == "3.9" else "numpy"
        env = {k: val for k, val in os.environ.items() if not k.startswith("UMP_ALLOC") and k != "PYTHONPATH"}
        pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary=:all:"]
        r = subprocess.run([*pip, wheel, numpy], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
        assert r.returncode == 0, f"{v}: {r.stdout} {r.stderr}"
        r = subprocess.run([py, "-m", "ump_alloc", "--version"], capture_output=True, text=True, env=env, cwd=tmp_path)
        assert r.returncode == 0 and r.stdout.strip() == f"ump-alloc {version}", f"{v}: {r.stdout} {r.stderr}"
        inc = subprocess.run([py, "-m", "ump_alloc", "--include"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout.strip()
        libdir = subprocess.run([py, "-m", "ump_alloc", "--libdir"], capture_output=True, text=True, env=env, cwd=tmp_path).stdout.strip()
        assert os.path.isfile(os.path.join(inc, "ump_alloc.h")), f"{v}: {inc}"
        assert os.path.isfile(os.path.join(libdir, "libump_alloc.so")), f"{v}: {libdir}"
        assert str(venv) in libdir, f"{v}: loaded a library outside the venv: {libdir}"
        r = subprocess.run([py, "-c", NUMPY_CHECK], capture_output=True, text=True, env={**env, "UMP_ALLOC": "1"}, cwd=tmp_path, timeout=300)
        assert r.returncode == 0 and " ok " in r.stdout, f"{v}: {r.stdout} {r.stderr}"
        if v == "3.9":
            assert r.stdout.startswith("1.22.4 "), r.stdout
        done.append(f"{v} (NumPy {r.stdout.split()[0]})")
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
