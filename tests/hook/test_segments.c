/* PyTorch's segments served by ump-alloc (issue 32), over a stand-in driver that serves device
 * memory (tests/fork/standin_cuda.c) and a stand-in runtime over it (fake_cudart_driver.c), with
 * the device side `device` (cuMemAlloc chunks): a segment comes from ump-alloc; its cudaFree
 * waits for the device (cudaFree's implicit synchronisation, kept); a second cudaFree of it, or
 * a free of an address inside it, is an error and never reaches the runtime, whose cudaFree
 * would release driver memory ump-alloc still caches (the next segment at that address then
 * crashed); cudaMalloc of 0 bytes gets CUDA's own answer. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "ump_alloc.h"


typedef int (*Alloc)(void **, size_t);
typedef int (*Free)(void *);

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s libc10_cuda.so\n", argv[0]);
        return 2;
    }
    void *drv = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!drv || !lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    void (*make_current)(void) = (void (*)(void))dlsym(drv, "standin_make_current");
    void (*counts)(long *, long *) = (void (*)(long *, long *))dlsym(drv, "standin_sync_free_counts");
    Alloc alloc = (Alloc)dlsym(lib, "c10_segment_alloc");
    Free release = (Free)dlsym(lib, "c10_segment_free");
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    int *mallocs = rt ? (int *)dlsym(rt, "fake_cudart_mallocs") : NULL;
    int *frees = rt ? (int *)dlsym(rt, "fake_cudart_frees") : NULL;
    if (!make_current || !counts || !alloc || !release || !mallocs || !frees) {
        fprintf(stderr, "stand-in symbols missing\n");
        return 2;
    }
    make_current(); /* the runtime made the device's context current, as for PyTorch */
    CHECK(ump_torch_hook_segments(argv[1]) == UMP_OK, "hook: %s", ump_last_error());
    long syncs0, drv_frees0, syncs1, drv_frees1;
    void *p = NULL;
    CHECK(alloc(&p, 4 << 20) == 0 && p, "a segment");
    CHECK(*mallocs == 0, "served by ump-alloc, not the runtime (%d calls)", *mallocs);
    struct ump_identity id = {.size = sizeof id};
    CHECK(ump_identify(p, &id) == UMP_OK && id.ours && id.kind == UMP_KIND_DEVICE && id.device == 0,
          "the segment is ump-alloc's device memory (ours %d kind %d)", id.ours, (int)id.kind);
    memset(p, 0x5a, 4 << 20);
    counts(&syncs0, &drv_frees0);
    CHECK(release(p) == 0, "cudaFree of the segment");
    counts(&syncs1, &drv_frees1);
    CHECK(syncs1 == syncs0 + 1, "cudaFree waited for the device (%ld syncs)", syncs1 - syncs0);
    CHECK(*frees == 0, "the runtime's cudaFree was not called");
    /* A second cudaFree, and one of an address inside a segment: errors, not forwarded. */
    int rc = release(p);
    counts(&syncs1, &drv_frees1);
    CHECK(rc == 1 && *frees == 0 && drv_frees1 == drv_frees0,
          "a second cudaFree is cudaErrorInvalidValue and reaches neither the runtime nor the "
          "driver (rc %d, runtime frees %d, driver frees %ld)", rc, *frees, drv_frees1 - drv_frees0);
    void *q = NULL;
    CHECK(alloc(&q, 4 << 20) == 0 && q, "the next segment");
    memset(q, 0x33, 4 << 20); /* its memory is still mapped: the driver never freed it */
    CHECK(release((char *)q + 16) == 1 && *frees == 0, "an address inside a segment is refused");
    CHECK(release(q) == 0, "cudaFree of the second segment");
    /* Zero bytes: what CUDA answers (success, NULL), from the runtime itself. */
    void *z = (void *)0x1;
    CHECK(alloc(&z, 0) == 0 && z == NULL && *mallocs == 1, "cudaMalloc(0): rc, %p, %d runtime calls",
          z, *mallocs);
    if (failures) {
        fprintf(stderr, "segments over the stand-in driver: %d check(s) failed\n", failures);
        return 1;
    }
    printf("segments over the stand-in driver: all checks passed\n");
    return 0;
}
