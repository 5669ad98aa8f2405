/* A stand-in libcudart.so.13 for tests/hook: cudaMalloc/cudaFree over malloc, counting calls. */
#include <stdlib.h>

int fake_cudart_mallocs = 0;
int fake_cudart_frees = 0;

int cudaMalloc(void **p, size_t n) {
    fake_cudart_mallocs++;
    if (!p)
        return 1; /* cudaErrorInvalidValue */
    *p = malloc(n ? n : 1);
    return *p ? 0 : 2;
}

int cudaFree(void *p) {
    fake_cudart_frees++;
    free(p);
    return 0;
}
