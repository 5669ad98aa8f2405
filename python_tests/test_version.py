"""One version: Cargo.toml, pyproject.toml, ump_alloc.__version__ and the library agree."""

import os
import re

import pytest

import ump_alloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKOUT = os.path.exists(os.path.join(ROOT, "Cargo.toml"))


def _toml_version(name):
    with open(os.path.join(ROOT, name)) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def test_versions_agree():
    """Cargo.toml is the one source: pyproject.toml declares the version dynamic (setup.py reads
    Cargo.toml), the installed metadata, ``__version__`` and the library all say Cargo's."""
    import importlib.metadata

    if not CHECKOUT:
        pytest.skip("not a checkout (the device runs a staged copy of python/ and python_tests/)")
    cargo = _toml_version("Cargo.toml")
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        pyproject = f.read()
    assert re.search(r'^dynamic\s*=\s*\[\s*"version"\s*\]', pyproject, re.M), "pyproject.toml must not repeat the version"
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert ump_alloc.__version__ == cargo
    assert ump_alloc.version() == cargo
    try:
        assert importlib.metadata.version("ump-alloc") == cargo
    except importlib.metadata.PackageNotFoundError:
        pass  # running from the source tree (PYTHONPATH=python), nothing installed


def test_the_package_is_typed():
    here = os.path.dirname(ump_alloc.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
