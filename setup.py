"""Build: cargo compiles the cdylib, which goes into the ``ump_alloc`` package under its plain
name (``libump_alloc.so``), with the C header (``ump_alloc/include/ump_alloc.h``) and a
relocatable pkg-config file (``ump_alloc/lib/pkgconfig/ump_alloc.pc``) for C users. The Python
code is pure and loads the library through ctypes, and nothing in the library depends on the
Python version, so the wheel is tagged ``py3-none-<platform>``: one wheel for every CPython >= 3.9.

The version has one source, Cargo.toml: the package metadata reads it here, and
``ump_alloc.__version__`` asks the library (``ump_version()``, Cargo's version).
``ump_alloc.pth`` and the top-level ``_ump_alloc_hooks`` module go to site-packages so that
``UMP_ALLOC=1`` switches ump-alloc on as a program imports NumPy, CuPy or PyTorch.

The library goes into the wheel stripped of its debug info (``[profile.release] debug = 1``
makes 7.9 MB of it), which is kept beside the built library as ``libump_alloc.so.debug``
(``UMP_BUILD_DEBUG_DIR``: in that folder instead), linked by ``.gnu_debuglink`` so that gdb
finds it there. ``UMP_BUILD_LIBRARY``: package that built library instead of running cargo
(``scripts/wheel.sh`` builds a manylinux one with cargo-zigbuild). ``build_backend.py`` checks
for cargo before anything is written."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

ROOT = os.path.dirname(os.path.abspath(__file__))


def cargo_version() -> str:
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        text = f.read()
    package = text.split("[package]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^version\s*=\s*"([^"]+)"', package, re.M).group(1)


PC = """\
prefix=${{pcfiledir}}/../..
libdir=${{prefix}}
includedir=${{prefix}}/include

Name: ump_alloc
Description: One allocator for NumPy, CuPy and PyTorch over memory both the CPU and the GPU reach
Version: {version}
Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lump_alloc
Cflags: -I${{includedir}}
"""


def strip_into(built: str, dest: str, debug_dir: str | None) -> None:
    """Copy the library ``built`` to ``dest`` without its debug info, which goes to
    ``libump_alloc.so.debug`` (in ``debug_dir``, else beside ``built``), linked by
    ``.gnu_debuglink``. Without binutils' objcopy the library is copied as it is, with a
    warning."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        print("setup.py: objcopy (binutils) not found: the library keeps its debug info", file=sys.stderr)
        shutil.copy2(built, dest)
        return
    debug = os.path.join(debug_dir or os.path.dirname(os.path.abspath(built)), "libump_alloc.so.debug")
    os.makedirs(os.path.dirname(debug), exist_ok=True)
    subprocess.check_call([objcopy, "--only-keep-debug", built, debug])
    subprocess.check_call([objcopy, "--strip-debug", f"--add-gnu-debuglink={debug}", built, dest])
    shutil.copymode(built, dest)


class build_py_with_library(build_py):
    """Build the Rust library with cargo and put it, the header, the pkg-config file, the .pth
    and its hook module into the build tree."""

    def run(self):
        super().run()
        pkg = os.path.join(self.build_lib, "ump_alloc")
        built = os.environ.get("UMP_BUILD_LIBRARY")
        if not built:
            cargo = os.environ.get("CARGO", "cargo")
            target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
            subprocess.check_call([cargo, "build", "--release", "--lib", "--manifest-path", os.path.join(ROOT, "Cargo.toml")])
            built = os.path.join(target, "release", "libump_alloc.so")
        for stale in glob.glob(os.path.join(pkg, "libump_alloc*.so")):  # an older build's name
            os.remove(stale)
        strip_into(built, os.path.join(pkg, "libump_alloc.so"), os.environ.get("UMP_BUILD_DEBUG_DIR"))
        os.makedirs(os.path.join(pkg, "include"), exist_ok=True)
        self.copy_file(os.path.join(ROOT, "include", "ump_alloc.h"), os.path.join(pkg, "include", "ump_alloc.h"))
        pc_dir = os.path.join(pkg, "lib", "pkgconfig")
        os.makedirs(pc_dir, exist_ok=True)
        with open(os.path.join(pc_dir, "ump_alloc.pc"), "w") as f:
            f.write(PC.format(version=cargo_version()))
        shutil.copy(os.path.join(ROOT, "python", "ump_alloc.pth"), os.path.join(self.build_lib, "ump_alloc.pth"))


class py3_none_wheel(bdist_wheel):
    """A platform wheel (it holds a native library) for any Python 3: py3-none-<platform>."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(
    version=cargo_version(),
    packages=["ump_alloc", "ump_alloc.allocators"],
    py_modules=["_ump_alloc_hooks"],
    package_dir={"": "python"},
    package_data={"ump_alloc": ["py.typed"]},
    cmdclass={"build_py": build_py_with_library, "bdist_wheel": py3_none_wheel},
    distclass=BinaryDistribution,
    zip_safe=False,
)
