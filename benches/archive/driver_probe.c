// Driver probe behind issue 12's design (docs/benchmarks-archive.md, "Virtual-memory device pool, realloc in place, managed residency"): the cost of each CUDA
// virtual-memory call and whether it waits for queued work, whether a copy may span two host
// registrations, the batch discard calls, and the overlap of a background migration to the host
// with the host's reads. Needs a GPU and the CUDA 13 header:
//
//   gcc -O2 -o driver_probe benches/archive/driver_probe.c -I/usr/local/cuda/include -lcuda -lpthread -ldl
//   ./driver_probe [all | vmm | busy | reg | discard | overlap | rest]
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        CUresult r_ = (x);                                                                     \
        if (r_ != CUDA_SUCCESS) {                                                              \
            const char *n_ = 0;                                                                \
            cuGetErrorName(r_, &n_);                                                           \
            printf("FAIL %s:%d %s -> %d %s\n", __FILE__, __LINE__, #x, r_, n_ ? n_ : "?");     \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

typedef CUresult (*prefetch_v2_t)(CUdeviceptr, size_t, CUmemLocation, unsigned, CUstream);
typedef CUresult (*discard_t)(CUdeviceptr *, size_t *, size_t, unsigned long long, CUstream);
typedef CUresult (*dpf_t)(CUdeviceptr *, size_t *, size_t, CUmemLocation *, size_t *, size_t,
                          unsigned long long, CUstream);
static prefetch_v2_t prefetch2;
static discard_t discard;
static dpf_t discard_prefetch, prefetch_batch;

static CUmemLocation loc_dev = {CU_MEM_LOCATION_TYPE_DEVICE, 0};
static CUmemLocation loc_host = {CU_MEM_LOCATION_TYPE_HOST, 0};

/* Where host sums go, so that the compiler keeps the reads. */
static volatile uint64_t sink;

static uint64_t host_sum(const uint64_t *p, size_t n) {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++) s += p[i];
    sink = s;
    return s;
}

// ---------------------------------------------------------------------------------------- VMM
static CUmemAllocationProp dev_prop(void) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = 0;
    return p;
}

static void vmm_costs(void) {
    CUmemAllocationProp prop = dev_prop();
    size_t gmin = 0, grec = 0;
    CK(cuMemGetAllocationGranularity(&gmin, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CK(cuMemGetAllocationGranularity(&grec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("granularity min %zu rec %zu\n", gmin, grec);
    CUdeviceptr big;
    double t = now();
    CUresult r = cuMemAddressReserve(&big, (size_t)1 << 40, 0, 0, 0);
    printf("reserve 1 TiB: rc %d in %.1f us\n", r, (now() - t) * 1e6);
    if (r == 0) cuMemAddressFree(big, (size_t)1 << 40);
    t = now();
    r = cuMemAddressReserve(&big, (size_t)16 << 40, 0, 0, 0);
    printf("reserve 16 TiB: rc %d in %.1f us\n", r, (now() - t) * 1e6);
    if (r == 0) cuMemAddressFree(big, (size_t)16 << 40);

    size_t sizes[] = {2u << 20, 32u << 20, 256u << 20, 1u << 30};
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    for (int si = 0; si < 4; si++) {
        size_t sz = sizes[si];
        int reps = sz <= (32u << 20) ? 20 : 5;
        double tc = 0, tm = 0, ta = 0, tu = 0, tr = 0, tremap = 0, talloc = 0, tfree = 0;
        CUdeviceptr va, va2;
        CK(cuMemAddressReserve(&va, sz, 0, 0, 0));
        CK(cuMemAddressReserve(&va2, sz, 0, 0, 0));
        for (int i = 0; i < reps; i++) {
            CUmemGenericAllocationHandle h;
            t = now();
            CK(cuMemCreate(&h, sz, &prop, 0));
            tc += now() - t;
            t = now();
            CK(cuMemMap(va, sz, 0, h, 0));
            tm += now() - t;
            t = now();
            CK(cuMemSetAccess(va, sz, &acc, 1));
            ta += now() - t;
            CK(cuMemsetD32(va, 0x12345678u + i, sz / 4));
            CK(cuCtxSynchronize());
            t = now();
            CK(cuMemUnmap(va, sz));
            tu += now() - t;
            // remap the same handle elsewhere (a handle cache)
            t = now();
            CK(cuMemMap(va2, sz, 0, h, 0));
            CK(cuMemSetAccess(va2, sz, &acc, 1));
            tremap += now() - t;
            uint32_t v = 0;
            CK(cuMemcpyDtoH(&v, va2 + sz - 4, 4));
            if (v != 0x12345678u + i) printf("REMAP CONTENT MISMATCH %x\n", v);
            CK(cuMemUnmap(va2, sz));
            t = now();
            CK(cuMemRelease(h));
            tr += now() - t;
            CUdeviceptr p;
            t = now();
            CK(cuMemAlloc(&p, sz));
            talloc += now() - t;
            t = now();
            CK(cuMemFree(p));
            tfree += now() - t;
        }
        printf("piece %5zu MiB: create %8.1f map %6.1f access %8.1f unmap %8.1f release %8.1f "
               "remap+access %8.1f | cuMemAlloc %8.1f cuMemFree %8.1f us\n",
               sz >> 20, tc / reps * 1e6, tm / reps * 1e6, ta / reps * 1e6, tu / reps * 1e6,
               tr / reps * 1e6, tremap / reps * 1e6, talloc / reps * 1e6, tfree / reps * 1e6);
        cuMemAddressFree(va, sz);
        cuMemAddressFree(va2, sz);
    }
    // one access call over several mappings
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, 8u << 20, 0, 0, 0));
    CUmemGenericAllocationHandle hs[4];
    for (int i = 0; i < 4; i++) {
        CK(cuMemCreate(&hs[i], 2u << 20, &prop, 0));
        CK(cuMemMap(va + i * (2u << 20), 2u << 20, 0, hs[i], 0));
    }
    r = cuMemSetAccess(va, 8u << 20, &acc, 1);
    printf("one cuMemSetAccess over 4 mappings: rc %d\n", r);
    r = cuMemsetD32(va, 7, (8u << 20) / 4);
    printf("memset across 4 mappings: rc %d\n", r);
    r = cuMemUnmap(va, 8u << 20);
    printf("one cuMemUnmap over 4 mappings: rc %d\n", r);
    if (r != 0)
        for (int i = 0; i < 4; i++) CK(cuMemUnmap(va + i * (2u << 20), 2u << 20));
    r = cuMemUnmap(va, 2u << 20);
    for (int i = 0; i < 4; i++) cuMemRelease(hs[i]);
    cuMemAddressFree(va, 8u << 20);
    // a copy across two mappings
}

// does unmap/map/create block while the GPU is busy elsewhere?
static void vmm_busy(void) {
    CUmemAllocationProp prop = dev_prop();
    CUmemAccessDesc acc = {{CU_MEM_LOCATION_TYPE_DEVICE, 0}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    size_t big = (size_t)4 << 30;
    CUdeviceptr a, b;
    CK(cuMemAlloc(&a, big));
    CK(cuMemAlloc(&b, big));
    CK(cuMemsetD32(a, 1, big / 4));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuMemcpyDtoDAsync(b, a, big, s));
    CK(cuStreamSynchronize(s));
    double t = now();
    for (int i = 0; i < 4; i++) CK(cuMemcpyDtoDAsync(b, a, big, s));
    CK(cuStreamSynchronize(s));
    double busy = now() - t;
    printf("busy work (4 x 4 GiB D2D): %.2f ms\n", busy * 1e3);
    size_t sz = 32u << 20;
    CUdeviceptr va;
    CK(cuMemAddressReserve(&va, sz, 0, 0, 0));
    const char *what[] = {"create", "map+access", "unmap", "release"};
    for (int k = 0; k < 4; k++) {
        CUmemGenericAllocationHandle h;
        if (k >= 1) CK(cuMemCreate(&h, sz, &prop, 0));
        if (k >= 2) {
            CK(cuMemMap(va, sz, 0, h, 0));
            CK(cuMemSetAccess(va, sz, &acc, 1));
        }
        if (k == 3) CK(cuMemUnmap(va, sz));
        for (int i = 0; i < 4; i++) CK(cuMemcpyDtoDAsync(b, a, big, s));
        t = now();
        if (k == 0) CK(cuMemCreate(&h, sz, &prop, 0));
        if (k == 1) {
            CK(cuMemMap(va, sz, 0, h, 0));
            CK(cuMemSetAccess(va, sz, &acc, 1));
        }
        if (k == 2) CK(cuMemUnmap(va, sz));
        if (k == 3) CK(cuMemRelease(h));
        double dt = now() - t;
        CUresult q = cuStreamQuery(s);
        printf("while busy: %-10s took %8.1f us; stream still busy after: %s\n", what[k],
               dt * 1e6, q == CUDA_ERROR_NOT_READY ? "yes" : "no");
        CK(cuStreamSynchronize(s));
        if (k == 0) CK(cuMemRelease(h));
        if (k == 1) {
            CK(cuMemUnmap(va, sz));
            CK(cuMemRelease(h));
        }
        if (k == 2) CK(cuMemRelease(h));
    }
    cuMemAddressFree(va, sz);
    // cuMemFree while busy, for comparison
    CUdeviceptr c;
    CK(cuMemAlloc(&c, sz));
    for (int i = 0; i < 4; i++) CK(cuMemcpyDtoDAsync(b, a, big, s));
    t = now();
    CK(cuMemFree(c));
    double dt = now() - t;
    printf("while busy: cuMemFree took %8.1f us; stream still busy after: %s\n", dt * 1e6,
           cuStreamQuery(s) == CUDA_ERROR_NOT_READY ? "yes" : "no");
    CK(cuStreamSynchronize(s));
    cuMemFree(a);
    cuMemFree(b);
    cuStreamDestroy(s);
}

// ---------------------------------------------------------------------- registered adjacency
static void registered_adjacent(void) {
    size_t half = 256u << 20, all = 2 * half;
    unsigned flags = CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP;
    char *two = mmap(0, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *one = mmap(0, all, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CK(cuMemHostRegister(two, half, flags));
    CK(cuMemHostRegister(two + half, half, flags));
    CK(cuMemHostRegister(one, all, flags));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, all));
    CK(cuMemsetD32(d, 0xabcdef01u, all / 4));
    for (int rep = 0; rep < 2; rep++) {
        for (int k = 0; k < 2; k++) {
            char *h = k ? one : two;
            memset(h, 0, all);
            CK(cuCtxSynchronize());
            double t = now();
            CUresult rr = CUDA_SUCCESS;
            for (int i = 0; i < 4 && rr == CUDA_SUCCESS; i++) rr = cuMemcpyDtoH(h, d, all);
            double dt = (now() - t) / 4;
            if (rr != CUDA_SUCCESS) { printf("D2H into %s registration(s): rc %d\n", k ? "one" : "two", rr); continue; }
            uint32_t *w = (uint32_t *)h;
            int ok = w[0] == 0xabcdef01u && w[all / 4 - 1] == 0xabcdef01u &&
                     w[half / 4 - 1] == 0xabcdef01u && w[half / 4] == 0xabcdef01u;
            t = now();
            for (int i = 0; i < 4; i++) CK(cuMemcpyHtoD(d, h, all));
            double dt2 = (now() - t) / 4;
            printf("D2H/H2D of 512 MiB into %s registration(s): %.1f / %.1f GB/s, content %s\n",
                   k ? "one" : "two", all / dt / 1e9, all / dt2 / 1e9, ok ? "ok" : "BAD");
        }
    }
    // device access across the boundary (memset through the device pointer)
    CUdeviceptr dp;
    CK(cuMemHostGetDevicePointer(&dp, two, 0));
    printf("registered device pointer == host pointer: %s\n", dp == (CUdeviceptr)two ? "yes" : "no");
    CUresult r = cuMemsetD32((CUdeviceptr)two + half - 4096, 0x5a5a5a5au, 8192 / 4);
    CK(cuCtxSynchronize());
    uint32_t *w = (uint32_t *)(two + half - 4096);
    printf("device memset across the two registrations: rc %d, host sees %x %x\n", r, w[0],
           w[2047]);
    // DMA copy of a range across the boundary
    r = cuMemcpyDtoH(two + half - (8u << 20), d, 16u << 20);
    printf("copy of 16 MiB across the boundary: rc %d\n", r);
    cuMemHostUnregister(two);
    cuMemHostUnregister(two + half);
    cuMemHostUnregister(one);
    cuMemFree(d);
}

// --------------------------------------------------------------------------------- discard
static void discard_probe(void) {
    if (!discard || !discard_prefetch) {
        printf("discard APIs missing\n");
        return;
    }
    size_t sz = (size_t)1 << 30;
    CUdeviceptr m;
    CK(cuMemAllocManaged(&m, sz, CU_MEM_ATTACH_GLOBAL));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(prefetch2(m, sz, loc_dev, 0, s));
    CK(cuStreamSynchronize(s));
    for (int variant = 0; variant < 4; variant++) {
        for (int rep = 0; rep < 2; rep++) {
            // GPU writes, host reads all (pages migrate to host)
            CK(cuMemsetD32Async(m, 0x11111111u * (rep + 1), sz / 4, s));
            CK(cuStreamSynchronize(s));
            host_sum((uint64_t *)m, sz / 8); /* the host reads it all */
            if (variant == 3) {  // resident case: bring back first
                CK(prefetch2(m, sz, loc_dev, 0, s));
                CK(cuStreamSynchronize(s));
            }
            double t = now();
            CUdeviceptr p = m;
            size_t n = sz;
            size_t idx = 0;
            if (variant == 1 || variant == 3) CK(discard(&p, &n, 1, 0, s));
            if (variant == 2) CK(discard_prefetch(&p, &n, 1, &loc_dev, &idx, 1, 0, s));
            double tcall = now() - t;
            CK(cuMemsetD32Async(m, 0x22222222u, sz / 4, s));
            CK(cuStreamSynchronize(s));
            double dt = now() - t;
            uint32_t v;
            CK(cuMemcpyDtoH(&v, m + sz - 4, 4));
            const char *names[] = {"no discard (host-resident)", "discard (host-resident)",
                                   "discard+prefetch (host-resident)",
                                   "discard (device-resident)"};
            printf("reuse 1 GiB, %-34s call %8.1f us, call+GPU write %8.2f ms, value %s\n",
                   names[variant], tcall * 1e6, dt * 1e3, v == 0x22222222u ? "ok" : "BAD");
        }
    }
    // small batch call cost
    CUdeviceptr ps[32];
    size_t ns[32];
    for (int i = 0; i < 32; i++) {
        ps[i] = m + (size_t)i * (4u << 20);
        ns[i] = 2u << 20;
    }
    CK(prefetch2(m, sz, loc_dev, 0, s));
    CK(cuStreamSynchronize(s));
    double t = now();
    for (int k = 0; k < 100; k++) CK(discard(ps, ns, 1, 0, s));
    double t1 = (now() - t) / 100;
    t = now();
    for (int k = 0; k < 100; k++) CK(discard(ps, ns, 32, 0, s));
    double t32 = (now() - t) / 100;
    CK(cuStreamSynchronize(s));
    printf("discard call: 1 range %.1f us, 32 ranges %.1f us (host time per call)\n", t1 * 1e6,
           t32 * 1e6);
    // unaligned range
    CUdeviceptr pu = m + 65536;
    size_t nu = 65536 * 3;
    CUresult r = discard(&pu, &nu, 1, 0, s);
    printf("discard of a 64 KiB-aligned 192 KiB range: rc %d\n", r);
    pu = m + 4096;
    nu = 4096;
    r = discard(&pu, &nu, 1, 0, s);
    printf("discard of a 4 KiB range: rc %d\n", r);
    CK(cuStreamSynchronize(s));
    cuMemFree(m);
    cuStreamDestroy(s);
}

// ------------------------------------------------------------------ host migration overlap
struct bg {
    CUdeviceptr p;
    size_t n, piece;
    CUstream s;
    CUcontext ctx;
    double issued;
};

static void *bg_prefetch(void *arg) {
    struct bg *b = arg;
    cuCtxSetCurrent(b->ctx);
    double t = now();
    for (size_t off = 0; off < b->n; off += b->piece) {
        size_t len = b->n - off < b->piece ? b->n - off : b->piece;
        CK(prefetch2(b->p + off, len, loc_host, 0, b->s));
        if (b->piece < b->n) CK(cuStreamSynchronize(b->s));
    }
    CK(cuStreamSynchronize(b->s));
    b->issued = now() - t;
    return 0;
}

static void overlap_probe(void) {
    size_t sz = (size_t)1 << 30;
    CUdeviceptr m;
    CK(cuMemAllocManaged(&m, sz, CU_MEM_ATTACH_GLOBAL));
    CUcontext ctx;
    CK(cuCtxGetCurrent(&ctx));
    CUstream s, bs;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CK(cuStreamCreate(&bs, CU_STREAM_NON_BLOCKING));
    char *pinned;
    CK(cuMemHostAlloc((void **)&pinned, sz, CU_MEMHOSTALLOC_PORTABLE));
    memset(pinned, 1, sz);
    const char *names[] = {"fault-driven read",
                           "prefetch+sync, then read (today)",
                           "async prefetch on 2nd stream, read at once",
                           "bg thread: one prefetch, read at once",
                           "bg thread: 64 MiB pieces, read at once",
                           "bg thread: 16 MiB pieces, read at once",
                           "copy into pinned, then read"};
    for (int rep = 0; rep < 3; rep++) {
        for (int v = 0; v < 7; v++) {
            uint32_t pat = 0x01020304u * (uint32_t)(rep * 7 + v + 1);
            CK(prefetch2(m, sz, loc_dev, 0, s));
            CK(cuMemsetD32Async(m, pat, sz / 4, s));
            CK(cuStreamSynchronize(s));
            uint64_t expect = (uint64_t)pat * 0x100000001ull * (sz / 8);
            pthread_t th;
            struct bg b = {m, sz, sz, bs, ctx, 0};
            double t = now(), tcall = 0;
            const uint64_t *src = (const uint64_t *)m;
            if (v == 1) {
                CK(prefetch2(m, sz, loc_host, 0, s));
                CK(cuStreamSynchronize(s));
            } else if (v == 2) {
                CK(prefetch2(m, sz, loc_host, 0, bs));
                tcall = now() - t;
            } else if (v >= 3 && v <= 5) {
                b.piece = v == 3 ? sz : v == 4 ? (64u << 20) : (16u << 20);
                pthread_create(&th, 0, bg_prefetch, &b);
            } else if (v == 6) {
                CK(cuMemcpyDtoHAsync(pinned, m, sz, s));
                CK(cuStreamSynchronize(s));
                src = (const uint64_t *)pinned;
            }
            uint64_t sum = host_sum(src, sz / 8);
            double dt = now() - t;
            if (v >= 3 && v <= 5) pthread_join(th, 0);
            if (v == 2) CK(cuStreamSynchronize(bs));
            printf("1 GiB %-44s %7.1f ms %s", names[v], dt * 1e3, sum == expect ? "ok" : "BAD");
            if (v == 2) printf(" (call returned in %.1f ms)", tcall * 1e3);
            if (v >= 3 && v <= 5) printf(" (bg done in %.1f ms)", b.issued * 1e3);
            printf("\n");
        }
    }
    // host read of pinned alone
    double t = now();
    uint64_t s2 = host_sum((uint64_t *)pinned, sz / 8);
    printf("host read of 1 GiB pinned alone: %.1f ms (%llu)\n", (now() - t) * 1e3,
           (unsigned long long)(s2 & 1));
    cuMemFreeHost(pinned);
    cuMemFree(m);
}

int main(int argc, char **argv) {
    CK(cuInit(0));
    CUdevice dev;
    CK(cuDeviceGet(&dev, 0));
    CUcontext ctx;
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    prefetch2 = (prefetch_v2_t)dlsym(lib, "cuMemPrefetchAsync_v2");
    discard = (discard_t)dlsym(lib, "cuMemDiscardBatchAsync");
    discard_prefetch = (dpf_t)dlsym(lib, "cuMemDiscardAndPrefetchBatchAsync");
    prefetch_batch = (dpf_t)dlsym(lib, "cuMemPrefetchBatchAsync");
    printf("symbols: prefetch_v2 %p discard %p discard_prefetch %p prefetch_batch %p\n",
           (void *)prefetch2, (void *)discard, (void *)discard_prefetch, (void *)prefetch_batch);
    const char *only = argc > 1 ? argv[1] : "all";
    if (!strcmp(only, "all") || !strcmp(only, "vmm")) vmm_costs();
    if (!strcmp(only, "all") || !strcmp(only, "busy")) vmm_busy();
    if (!strcmp(only, "all") || !strcmp(only, "reg") || !strcmp(only, "rest")) registered_adjacent();
    if (!strcmp(only, "all") || !strcmp(only, "discard") || !strcmp(only, "rest")) discard_probe();
    if (!strcmp(only, "all") || !strcmp(only, "overlap") || !strcmp(only, "rest")) overlap_probe();
    printf("done\n");
    return 0;
}
