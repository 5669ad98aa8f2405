#!/usr/bin/env bash
# The PyTorch C++ ABI test (tests/cxx/test_torch_abi.cpp) against a stand-in libtorch_cuda.so
# (tests/cxx/fake_torch.cpp) that exports PyTorch 2.11's mangled names. Needs g++.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
build="tests/cxx/build"
mkdir -p "$build/fake"
cargo build --release --quiet
g++ -std=c++17 -shared -fPIC -O1 -g -Wall -Wextra -Werror -o "$build/fake/libtorch_cuda.so" \
    tests/cxx/fake_torch.cpp
g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -I include -o "$build/test_torch_abi" \
    tests/cxx/test_torch_abi.cpp -L target/release -lump_alloc "-Wl,-rpath,$root/target/release" -ldl
env -u UMP_ALLOC_MODE -u UMP_ALLOC_LIMIT UMP_ALLOC_NO_CUDA=1 \
    "$build/test_torch_abi" "$root/$build/fake/libtorch_cuda.so"
if command -v valgrind >/dev/null; then
    env -u UMP_ALLOC_MODE -u UMP_ALLOC_LIMIT UMP_ALLOC_NO_CUDA=1 valgrind -q --error-exitcode=1 \
        --leak-check=no "$build/test_torch_abi" "$root/$build/fake/libtorch_cuda.so"
fi
