/* ump_torch_hook_segments against stand-ins: a libc10_cuda.so that calls cudaMalloc/cudaFree of
 * a libcudart.so.13 (tests/hook/fake_*.c). Without a GPU, ump-alloc serves no segment, so the
 * hook must hand every call to the real functions: the fake runtime's counters show each one
 * arrived. That the hook sits in the slot shows where it answers without forwarding: a NULL
 * out-pointer is refused by the hook itself (the runtime's counter does not move). Also: bad
 * arguments, a library without the imports, a library that is not loaded, unhook and rehook.
 * The segments themselves (ump-alloc memory under PyTorch) are tested on the GPU machine
 * (python_tests/torch_checks.py). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ump_alloc.h"


static const char *last(void) {
    const char *m = ump_last_error();
    return m ? m : "";
}

typedef int (*Alloc)(void **, size_t);
typedef int (*Free)(void *);

/* The mappings of the file whose name contains `name`, with their permissions, one per line:
 * hooking must leave every page of the library as the loader protected it. */
static void maps_of(const char *name, char *out, size_t len) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    size_t used = 0;
    out[0] = '\0';
    if (!f) return;
    while (fgets(line, sizeof line, f))
        if (strstr(line, name)) {
            /* range and permissions: the first two fields */
            char range[64], perms[8];
            if (sscanf(line, "%63s %7s", range, perms) == 2)
                used += (size_t)snprintf(out + used, len > used ? len - used : 0, "%s %s\n", range, perms);
        }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s libc10_cuda.so libother.so\n", argv[0]);
        return 2;
    }
    const char *c10 = argv[1], *other = argv[2];
    CHECK(ump_torch_hook_segments(NULL) == UMP_ERR_NULL, "NULL path");
    CHECK(ump_torch_hook_segments(c10) == UMP_ERR_UNSUPPORTED && strstr(last(), "not loaded"),
          "a library that is not loaded: %s", last());
    CHECK(ump_torch_segments_hooked() == 0, "nothing hooked yet");
    void *lib = dlopen(c10, RTLD_NOW | RTLD_LOCAL);
    void *oth = dlopen(other, RTLD_NOW | RTLD_LOCAL);
    if (!lib || !oth) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 2;
    }
    CHECK(ump_torch_hook_segments(other) == UMP_ERR_UNSUPPORTED && strstr(last(), "cudaMalloc"),
          "a library without the imports is refused: %s", last());
    CHECK(ump_torch_segments_hooked() == 0, "a refusal hooks nothing");
    Alloc alloc = (Alloc)dlsym(lib, "c10_segment_alloc");
    Free release = (Free)dlsym(lib, "c10_segment_free");
    void *rt = dlopen("libcudart.so.13", RTLD_NOW | RTLD_NOLOAD);
    int *mallocs = rt ? (int *)dlsym(rt, "fake_cudart_mallocs") : NULL;
    int *frees = rt ? (int *)dlsym(rt, "fake_cudart_frees") : NULL;
    if (!alloc || !release || !mallocs || !frees) {
        fprintf(stderr, "stand-in symbols missing: %s\n", dlerror());
        return 2;
    }
    /* HOOK_TEST_INTERPOSER=1: run with tests/hook/fake_interposer.c preloaded. */
    const char *ie = getenv("HOOK_TEST_INTERPOSER");
    int interposed = ie && strcmp(ie, "1") == 0;
    int *chained = interposed ? (int *)dlsym(RTLD_DEFAULT, "interposer_mallocs") : NULL;
    if (interposed && !chained) {
        fprintf(stderr, "the interposer is not preloaded\n");
        return 2;
    }
    char maps_before[4096], maps_after[4096];
    maps_of("libc10_cuda", maps_before, sizeof maps_before);
    /* Before the hook: straight to the runtime, a NULL out-pointer too. */
    CHECK(alloc(NULL, 16) == 1 && *mallocs == 1, "the runtime refuses NULL itself");
    *mallocs = 0;
    void *p = NULL;
    CHECK(alloc(&p, 1 << 20) == 0 && p && *mallocs == 1, "unhooked cudaMalloc");
    if (interposed) *mallocs = 0;
    CHECK(ump_torch_hook_segments(c10) == UMP_OK, "hook: %s", last());
    CHECK(ump_torch_segments_hooked() == 1, "hooked");
    maps_of("libc10_cuda", maps_after, sizeof maps_after);
    CHECK(strcmp(maps_before, maps_after) == 0 && maps_before[0],
          "every page of the library keeps its protection:\nbefore\n%safter\n%s", maps_before,
          maps_after);
    const char *target = ump_torch_segments_target();
    CHECK(target && strstr(target, interposed ? "libinterposer" : "libcudart"),
          "requests not served go to %s", target ? target : "(null)");
    if (interposed) {
        /* An interposer bound in the slot before the hook is chained to, not bypassed. */
        int before = *chained;
        void *x = NULL;
        CHECK(alloc(&x, 4096) == 0 && x && *chained == before + 1 && release(x) == 0,
              "forwarded through the interposer: %d calls", *chained);
        printf("segment hook: interposer chained\n");
        return failures ? 1 : 0;
    }
    CHECK(ump_torch_hook_segments(c10) == UMP_OK, "hooking again does nothing: %s", last());
    CHECK(alloc(NULL, 16) == 1 && *mallocs == 1, "the hook is in the slot: it refuses NULL itself");
    /* A segment made before the hook is freed through the runtime. */
    CHECK(release(p) == 0 && *frees == 1, "a segment from before the hook: frees %d", *frees);
    /* No GPU here: the hook serves nothing itself and forwards every call. */
    void *q = NULL;
    CHECK(alloc(&q, 3 << 20) == 0 && q && *mallocs == 2, "forwarded cudaMalloc: %d", *mallocs);
    memset(q, 0x5a, 3 << 20); /* real memory from the runtime */
    CHECK(release(q) == 0 && *frees == 2, "forwarded cudaFree: %d", *frees);
    CHECK(release(NULL) == 0 && *frees == 3, "cudaFree(NULL) reaches the runtime (it initialises CUDA)");
    /* Unhook: malloc back to the runtime's; free stays ump-alloc's and still forwards. */
    CHECK(ump_torch_unhook_segments() == UMP_OK && ump_torch_segments_hooked() == 0, "unhook");
    CHECK(ump_torch_unhook_segments() == UMP_OK, "unhooking twice is harmless");
    void *r = NULL;
    CHECK(alloc(&r, 4096) == 0 && r && *mallocs == 3, "cudaMalloc after unhook");
    CHECK(alloc(NULL, 16) == 1 && *mallocs == 4, "after unhook the runtime's own cudaMalloc answers");
    *mallocs = 3;
    CHECK(release(r) == 0 && *frees == 4, "cudaFree after unhook");
    CHECK(ump_torch_hook_segments(c10) == UMP_OK && ump_torch_segments_hooked() == 1, "rehook: %s", last());
    void *s = NULL;
    CHECK(alloc(&s, 4096) == 0 && s && *mallocs == 4 && release(s) == 0 && *frees == 5, "after rehook");
    /* The library stays loaded while hooked (issue 32): dlclose must not unload it under
     * its swapped slots, and hooking the reloaded library finds it hooked for real. */
    dlclose(lib);
    CHECK(dlopen(c10, RTLD_NOW | RTLD_NOLOAD) != NULL, "dlclose left the hooked library loaded");
    lib = dlopen(c10, RTLD_NOW | RTLD_LOCAL);
    alloc = lib ? (Alloc)dlsym(lib, "c10_segment_alloc") : NULL;
    CHECK(alloc != NULL, "reloaded: %s", dlerror());
    if (alloc) {
        int m = *mallocs;
        CHECK(alloc(NULL, 16) == 1 && *mallocs == m, "the reloaded library's slot is still hooked");
        CHECK(ump_torch_hook_segments(c10) == UMP_OK && ump_torch_segments_hooked() == 1,
              "hooking the reloaded library: %s", last());
        CHECK(ump_torch_unhook_segments() == UMP_OK, "unhook after dlclose: %s", last());
        CHECK(alloc(NULL, 16) == 1 && *mallocs == m + 1, "unhooked for real: the runtime answers");
    }
    if (failures) {
        fprintf(stderr, "segment hook: %d check(s) failed\n", failures);
        return 1;
    }
    printf("segment hook: all checks passed\n");
    return 0;
}
