#!/usr/bin/env bash
# Set up (first run) and run every test: Rust (unit, header), C (ASan + valgrind), Python.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
"$root/scripts/setup.sh"
echo "== rustfmt / clippy"
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
echo "== cargo test"
cargo test --quiet
echo "== C ABI (ASan, valgrind)"
bash tests/c/run.sh
echo "== PyTorch C++ ABI (a stand-in libtorch_cuda.so)"
bash tests/cxx/run.sh
echo "== PyTorch segment hook (stand-in libc10_cuda.so and libcudart.so.13)"
bash tests/hook/run.sh
echo "== fork torture and fork race (stand-in driver)"; bash tests/fork/run.sh
echo "== pytest"
.venv/bin/python -m pytest python_tests -q -p no:cacheprovider
