// The small-block hot path through the C ABI, for comparing two builds of the library
// instruction by instruction (issue 20 measured what its fork check costs with it):
//
//   cc -O2 -o hot_path_probe benches/archive/hot_path_probe.c -Iinclude -Ltarget/release
//      -Wl,-rpath,$PWD/target/release -lump_alloc      (one line)
//   UMP_ALLOC_NO_CUDA=1 valgrind --tool=callgrind ./hot_path_probe 3000000   # instructions
//   UMP_ALLOC_NO_CUDA=1 ./hot_path_probe 100000000                           # time
//
// 64 live blocks of 16..1024 bytes are replaced round-robin, so that every allocation and
// free goes through the thread cache. Build each library from a clean copy at the same path:
// the path enters the crate's metadata hash, which changes how code is split among codegen
// units and so what LLVM inlines (up to 12% of the instructions here).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <ump_alloc.h>

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 30000000;
    void *p[64] = {0};
    size_t sz[64] = {0};
    uint64_t x = 88172645463325252ull, sink = 0;
    for (long i = 0; i < n; i++) {
        int k = (int)(i & 63);
        if (p[k]) ump_free(p[k], sz[k]);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        sz[k] = 16 + (x & 1008);
        p[k] = ump_malloc(sz[k]);
        sink += (uintptr_t)p[k];
    }
    printf("%llu\n", (unsigned long long)(sink & 1));
    return 0;
}
