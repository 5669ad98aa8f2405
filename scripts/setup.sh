#!/usr/bin/env bash
# Shared set-up for demo.sh and test.sh: a virtual environment in .venv with ump-alloc installed
# (pip install . builds the Rust library with cargo, see setup.py) and the test requirements.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
command -v cargo >/dev/null || { echo "setup: cargo (Rust toolchain) is required" >&2; exit 1; }
py=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q --disable-pip-version-check "numpy>=1.22" "numpy_allocator>=1.2" "pytest>=7" \
    "dask[array,distributed]>=2024.1"
.venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps .
