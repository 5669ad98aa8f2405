/* A stand-in libcudart.so.13 over the CUDA driver (tests/fork/standin_cuda.c as libcuda.so.1):
 * cudaMalloc/cudaFree call cuMemAlloc/cuMemFree, as the real runtime does. cudaMalloc of 0 bytes
 * succeeds with NULL (what CUDA 13's runtime returned on the lent H100, 2026-11-28). */
#include <stddef.h>

int cuMemAlloc_v2(unsigned long long *p, size_t n);
int cuMemFree_v2(unsigned long long p);

int fake_cudart_mallocs = 0;
int fake_cudart_frees = 0;

int cudaMalloc(void **p, size_t n) {
    fake_cudart_mallocs++;
    if (!p) return 1; /* cudaErrorInvalidValue */
    if (n == 0) {
        *p = NULL;
        return 0;
    }
    unsigned long long d = 0;
    int rc = cuMemAlloc_v2(&d, n);
    *p = rc == 0 ? (void *)(size_t)d : NULL;
    return rc == 0 ? 0 : 2; /* cudaErrorMemoryAllocation */
}

int cudaFree(void *p) {
    fake_cudart_frees++;
    if (!p) return 0;
    return cuMemFree_v2((unsigned long long)(size_t)p) == 0 ? 0 : 1;
}
