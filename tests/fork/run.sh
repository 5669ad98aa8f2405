#!/usr/bin/env bash
# fork() tests of the pinned host side, over a stand-in CUDA driver (no GPU needed):
#   - standin_cuda.c: libcuda.so.1 answering like one GPU without HMM/ATS, so that ump_malloc
#     gives pinned memory in the memory file shared with fork children (README "fork(): what a
#     child gets"), and without virtual memory management, so that device pools are cuMemAlloc
#     chunks;
#   - torture.c: 8 threads churn stamped blocks while the process forks 300 times; every child
#     re-reads the blocks live at its fork and must find them unchanged (blocks the parent frees
#     are held back while a child may read them). FORK_TORTURE_RUNS runs (default 3; about 6-10
#     s each on a 2-core box) with UMP_ALLOC_PINNED_FORK=share (the default), one with copy
#     (the control, about 10-20 s: fork copies the pages);
#   - race.c: fork() while another thread maps a fresh process's first chunk (the host side's
#     and the device side's), FORK_RACE_ITERS fresh processes (default 400, the variants
#     alternating), each killed as a hang after 10 s; the host block is FORK_RACE_SIZE_MIB
#     (default 128: about 0.15 s a host iteration, 0.02 s a device one; 512 MiB takes 0.5 s).
# Exits non-zero on any failure.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git -C "$here" rev-parse --show-toplevel 2>/dev/null || (cd "$here/../.." && pwd))"
cd "$root"
# shellcheck source=../lib.sh
source tests/lib.sh

build="target/fork-tests"
mkdir -p "$build"
build_library

CFLAGS=(-O1 -g -Wall -Wextra -Werror -pthread -I include)

step "compile the stand-in libcuda.so.1, torture.c and race.c"
cc "${CFLAGS[@]}" -shared -fPIC tests/fork/standin_cuda.c -o "$build/libcuda.so.1"
cc "${CFLAGS[@]}" tests/fork/torture.c -o "$build/torture" "${LDFLAGS[@]}"
cc "${CFLAGS[@]}" tests/fork/race.c -o "$build/race" "${LDFLAGS[@]}"

# The runs must not inherit configuration from the caller's environment, and must load the
# stand-in driver (before any real one).
unset UMP_ALLOC UMP_ALLOC_MODE UMP_ALLOC_HOST_SIDE UMP_ALLOC_DEVICE_SIDE UMP_ALLOC_DEVICE_VMM \
    UMP_ALLOC_PINNED_FORK UMP_ALLOC_PINNED_LIMIT UMP_ALLOC_NO_CUDA UMP_ALLOC_LIMIT \
    UMP_ALLOC_HOST_RETAIN UMP_ALLOC_ALIGNMENT
export LD_LIBRARY_PATH="$root/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

runs="${FORK_TORTURE_RUNS:-3}"
race_iters="${FORK_RACE_ITERS:-400}"
race_mib="${FORK_RACE_SIZE_MIB:-128}"

# The blocks must be shared pages: pinned as they are made (UMP_ALLOC_PIN=eager, the memory of
# a process that uses a GPU) and, every other run, waiting to be pinned (lazy-all). The
# default, lazy, gives large blocks plain pages until the first use of a GPU on this kernel.
for ((i = 1; i <= runs; i++)); do
    pin=$([ $((i % 2)) -eq 1 ] && echo eager || echo lazy-all)
    stage "fork torture, UMP_ALLOC_PINNED_FORK=share, UMP_ALLOC_PIN=$pin, run $i of $runs" \
        env UMP_ALLOC_PIN=$pin "$build/torture"
done
stage "fork torture, UMP_ALLOC_PINNED_FORK=copy (control)" \
    env UMP_ALLOC_PINNED_FORK=copy UMP_ALLOC_PIN=eager "$build/torture"
# Eager: the first chunk is registered as it is made, inside its pool's lock (the window of the
# deadlock this guards against).
stage "fork racing the first chunk mapping ($race_iters fresh processes, host and device)" \
    env UMP_ALLOC_PIN=eager "$build/race" --iters "$race_iters" --size-mib "$race_mib"

finish "all fork tests passed"
