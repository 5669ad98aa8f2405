#!/usr/bin/env bash
# The segments route's hook (ump_torch_hook_segments) against a stand-in libc10_cuda.so that
# calls cudaMalloc/cudaFree of a stand-in libcudart.so.13, as PyTorch's caching allocator does.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
build="tests/hook/build"
mkdir -p "$build"
cargo build --release --quiet
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -Wl,-soname,libcudart.so.13 -o "$build/libcudart.so.13" tests/hook/fake_cudart.c
# Full RELRO (-z now) as PyTorch's wheels are linked: the slots are read-only after loading.
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -Wl,-z,relro,-z,now -o "$build/libc10_cuda.so" \
    tests/hook/fake_c10_cuda.c -L"$build" -l:libcudart.so.13 "-Wl,-rpath,$root/$build"
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -o "$build/libother.so" tests/hook/fake_other.c
cc -O1 -g -Wall -Wextra -Werror -I include -o "$build/test_hook" tests/hook/test_hook.c \
    -L target/release -lump_alloc "-Wl,-rpath,$root/target/release" -ldl
run() { env -u UMP_ALLOC_MODE -u UMP_ALLOC_LIMIT UMP_ALLOC_NO_CUDA=1 "$@" \
    "$root/$build/libc10_cuda.so" "$root/$build/libother.so"; }
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -o "$build/libinterposer.so" tests/hook/fake_interposer.c -ldl
run "$build/test_hook"
# An interposer of cudaMalloc preloaded (as torch_memory_saver is): chained to, not bypassed.
LD_PRELOAD="$root/$build/libinterposer.so" HOOK_TEST_INTERPOSER=1 run "$build/test_hook"
if command -v valgrind >/dev/null; then
    run valgrind -q --error-exitcode=1 --leak-check=no "$build/test_hook"
fi
# Segments served by ump-alloc: a stand-in driver that serves device memory, a runtime over it.
drv="$build/driver"
mkdir -p "$drv"
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -pthread -o "$drv/libcuda.so.1" tests/fork/standin_cuda.c
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -Wl,-soname,libcudart.so.13 -o "$drv/libcudart.so.13" \
    tests/hook/fake_cudart_driver.c -L"$drv" -l:libcuda.so.1 "-Wl,-rpath,$root/$drv"
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -Wl,-z,relro,-z,now -o "$drv/libc10_cuda.so" \
    tests/hook/fake_c10_cuda.c -L"$drv" -l:libcudart.so.13 "-Wl,-rpath,$root/$drv"
cc -O1 -g -Wall -Wextra -Werror -I include -o "$drv/test_segments" tests/hook/test_segments.c \
    -L target/release -lump_alloc "-Wl,-rpath,$root/target/release" -ldl
env -u UMP_ALLOC_MODE -u UMP_ALLOC_LIMIT -u UMP_ALLOC_NO_CUDA LD_LIBRARY_PATH="$root/$drv" \
    UMP_ALLOC_DEVICE_SIDE=device "$drv/test_segments" "$root/$drv/libc10_cuda.so"
# Lazy binding (no -z now): the slots are in the writable .got.plt, not yet resolved.
cc -shared -fPIC -O1 -g -Wall -Wextra -Werror -Wl,-z,lazy -o "$build/libc10_cuda.so" \
    tests/hook/fake_c10_cuda.c -L"$build" -l:libcudart.so.13 "-Wl,-rpath,$root/$build"
LD_BIND_NOW= run "$build/test_hook"
