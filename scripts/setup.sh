#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: a virtual environment in .venv with ump-alloc installed
# (pip install . builds the Rust library with cargo, see setup.py) and the test requirements.
# One line per step on standard output ("setup: ..."); pip itself runs quiet.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
say() { echo "setup: $*"; }
command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
py=${PYTHON:-python3}
first=
if [ ! -x .venv/bin/python ]; then
    first=1
    "$py" -c 'import sys; sys.exit(sys.version_info < (3, 9))' || {
        echo "setup: Python >= 3.9 is required; $py is $("$py" --version 2>&1) (PYTHON=python3.X chooses another)" >&2
        exit 1
    }
    say "creating .venv ($py -m venv) and upgrading its pip"
    "$py" -m venv .venv
    .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
fi
reqs=("numpy>=1.22" "numpy_allocator>=1.2" "pytest>=7" "dask[array,distributed]>=2024.1")
if [ -n "$first" ]; then
    say "installing numpy, numpy_allocator, pytest and dask from PyPI into .venv (first run only, about a minute)"
else
    say "checking numpy, numpy_allocator, pytest and dask in .venv"
fi
.venv/bin/python -m pip install -q --disable-pip-version-check "${reqs[@]}"
say "building the Rust library (cargo build --release) and installing ump-alloc into .venv"
.venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps .
say "done"
