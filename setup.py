"""Build: setuptools-rust compiles the cdylib with cargo and places libump_alloc*.so inside the
ump_alloc package (Binding.NoBinding: a plain C library, no Python extension module). The
package itself is pure Python over ctypes. ump_alloc.pth goes to site-packages so that
UMP_ALLOC=1 enables ump-alloc at interpreter start."""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "python", "ump_alloc.pth")
        shutil.copy(src, os.path.join(self.build_lib, "ump_alloc.pth"))


setup(
    packages=["ump_alloc", "ump_alloc.allocators"],
    package_dir={"": "python"},
    package_data={"ump_alloc": ["py.typed"]},
    rust_extensions=[
        RustExtension("ump_alloc.libump_alloc", path="Cargo.toml", binding=Binding.NoBinding, debug=False)
    ],
    cmdclass={"build_py": build_py_with_pth},
    zip_safe=False,
)
