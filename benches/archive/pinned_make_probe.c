// How long making N GiB of pinned host memory takes, by how its pages are made before
// cuMemHostRegister populates and pins them: anonymous pages with huge pages advised (the pinned
// host side before issue 20), and pages of a memory file mapped shared (after issue 20) with the
// file's pages allocated first in bulk (fallocate), faulted in first (MADV_POPULATE_WRITE), both,
// or neither (the registration faults them in). Modes interleaved, one fresh mapping each time.
//
//   gcc -O2 -pthread -o pinned_make_probe benches/archive/pinned_make_probe.c -ldl
//   ./pinned_make_probe [--reps 3] GIB [GIB ...]
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <pthread.h>
#include <unistd.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef int (*init_t)(unsigned);
typedef int (*dev_t_)(int *, int);
typedef int (*ctx_t)(void **, unsigned, int);
typedef int (*reg_t)(void *, size_t, unsigned);
typedef int (*unreg_t)(void *);
static reg_t reg;
static unreg_t unreg;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

// How each mode makes the pages before registering: bulk allocation of the file's pages
// (fallocate), then a populate advice (0: none) split between `threads` threads.
struct mode { const char *name; int anon, fallocate, advice, threads; };
static const struct mode modes[] = {
    {"anon + MADV_HUGEPAGE, register", 1, 0, 0, 1},
    {"memfd, register", 0, 0, 0, 1},
    {"memfd, fallocate, register", 0, 1, 0, 1},
    {"memfd, POPULATE_WRITE, register", 0, 0, MADV_POPULATE_WRITE, 1},
    {"memfd, POPULATE_WRITE x4 threads, register", 0, 0, MADV_POPULATE_WRITE, 4},
    {"memfd, fallocate, POPULATE_READ, register", 0, 1, MADV_POPULATE_READ, 1},
    {"memfd, fallocate, POPULATE_READ x4, register", 0, 1, MADV_POPULATE_READ, 4},
    {"memfd, POPULATE_READ, register", 0, 0, MADV_POPULATE_READ, 1},
};
enum { MODES = sizeof modes / sizeof modes[0] };

struct piece { char *p; size_t n; int advice, rc; };
static void *populate(void *arg) {
    struct piece *x = arg;
    x->rc = madvise(x->p, x->n, x->advice);
    return 0;
}

// The advice over [p, p+n) split between `threads` threads (2 MiB-aligned pieces).
static int populate_by(char *p, size_t n, int advice, int threads) {
    pthread_t t[16];
    struct piece x[16];
    size_t step = (n / threads + (1 << 21) - 1) & ~(size_t)((1 << 21) - 1);
    int k = 0;
    for (size_t off = 0; off < n && k < 16; off += step, k++) {
        x[k] = (struct piece){p + off, off + step > n ? n - off : step, advice, 0};
        pthread_create(&t[k], 0, populate, &x[k]);
    }
    int rc = 0;
    for (int i = 0; i < k; i++) pthread_join(t[i], 0), rc |= x[i].rc;
    return rc;
}
static double prep_s;

// Seconds to make and register n bytes in the mode; -1 on a failure (printed).
static double make(const struct mode *m, size_t n) {
    double t = now();
    int fd = -1;
    char *p;
    if (m->anon) {
        p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p != MAP_FAILED) madvise(p, n, MADV_HUGEPAGE);
    } else {
        fd = memfd_create("probe", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, n)) return perror("memfd"), -1;
        if (m->fallocate && fallocate(fd, 0, 0, n)) return perror("fallocate"), -1;
        p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (p == MAP_FAILED) return perror("mmap"), -1;
    if (m->advice && populate_by(p, n, m->advice, m->threads)) return perror("madvise(POPULATE)"), -1;
    prep_s = now() - t;
    int rc = reg(p, n, 1 | 2);
    double dt = now() - t;
    if (rc) fprintf(stderr, "cuMemHostRegister: %d\n", rc), dt = -1;
    for (size_t i = 0; i < n; i += 1 << 21) p[i] = 1;  // touched: it is usable
    if (!rc) unreg(p);
    munmap(p, n);
    if (fd >= 0) close(fd);
    return dt;
}

int main(int argc, char **argv) {
    int reps = 3, a = 1;
    if (a + 1 < argc && !strcmp(argv[a], "--reps")) reps = atoi(argv[a + 1]), a += 2;
    if (a >= argc) return fprintf(stderr, "usage: %s [--reps N] GIB [GIB ...]\n", argv[0]), 2;
    void *cu = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cu) return printf("skipped: no libcuda.so.1\n"), 0;
    void *ctx;
    int dev;
    ((init_t)dlsym(cu, "cuInit"))(0);
    ((dev_t_)dlsym(cu, "cuDeviceGet"))(&dev, 0);
    ((ctx_t)dlsym(cu, "cuCtxCreate_v2"))(&ctx, 0, dev);
    reg = (reg_t)dlsym(cu, "cuMemHostRegister_v2");
    unreg = (unreg_t)dlsym(cu, "cuMemHostUnregister");
    for (; a < argc; a++) {
        size_t n = (size_t)(atof(argv[a]) * (1 << 30)) & ~(size_t)((1 << 21) - 1);
        double t[MODES][64], prep[MODES][64];
        for (int r = 0; r < reps && r < 64; r++)
            for (int m = 0; m < MODES; m++) t[m][r] = make(&modes[m], n), prep[m][r] = prep_s;
        printf("%s GiB, %d rounds (seconds, each round's: total (before registering)):\n", argv[a], reps);
        for (int m = 0; m < MODES; m++) {
            printf("  %-46s", modes[m].name);
            for (int r = 0; r < reps && r < 64; r++) printf(" %.3f (%.3f)", t[m][r], prep[m][r]);
            printf("\n");
        }
    }
    return 0;
}
