"""One version: Cargo.toml, pyproject.toml, ump_alloc.__version__ and the library agree."""

import os
import re

import ump_alloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _toml_version(name):
    with open(os.path.join(ROOT, name)) as f:
        return re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M).group(1)


def test_versions_agree():
    cargo = _toml_version("Cargo.toml")
    assert _toml_version("pyproject.toml") == cargo
    assert ump_alloc.__version__ == cargo
    assert ump_alloc.version() == cargo


def test_the_package_is_typed():
    here = os.path.dirname(ump_alloc.__file__)
    assert os.path.exists(os.path.join(here, "py.typed"))
