/* A stand-in libc10_cuda.so for tests/hook: PyTorch's caching allocator calls cudaMalloc and
 * cudaFree of the libcudart it links, through its import slots; so does this. */
#include <stddef.h>

int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);

int c10_segment_alloc(void **p, size_t n) { return cudaMalloc(p, n); }
int c10_segment_free(void *p) { return cudaFree(p); }
