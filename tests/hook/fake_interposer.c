/* A cudaMalloc/cudaFree interposer preloaded before PyTorch (as torch_memory_saver is): it
 * counts each call and hands it on to the CUDA runtime's (the next definition, or the loaded
 * libcudart.so.13 where that one is not in the global scope). The segment hook must chain to
 * it, not bypass it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

int interposer_mallocs = 0;

static void *next(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (!f) {
        void *rt = dlopen("libcudart.so.13", RTLD_LAZY | RTLD_NOLOAD);
        f = rt ? dlsym(rt, name) : NULL;
    }
    return f;
}

int cudaMalloc(void **p, size_t n) {
    int (*f)(void **, size_t) = (int (*)(void **, size_t))next("cudaMalloc");
    interposer_mallocs++;
    return f ? f(p, n) : 2;
}

int cudaFree(void *p) {
    int (*f)(void *) = (int (*)(void *))next("cudaFree");
    return f ? f(p) : 1;
}
