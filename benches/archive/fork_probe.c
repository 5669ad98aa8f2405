// Fork probe behind issue 20's design (docs/benchmarks-archive.md, "fork() and the pinned host side"): what fork() costs with
// a large populated (and optionally pinned) host buffer, for three ways of mapping it:
//
//   anon      anonymous private memory (ump-alloc's pinned host side before issue 20)
//   shared    a memfd mapped MAP_SHARED at file offset = address; the child remaps it
//             MAP_PRIVATE|MAP_FIXED from the fd, so its writes stay private
//   dontfork  the same with MADV_DONTFORK on the range: fork copies not even its page tables
//
// Pinning (--pin): none; uring (io_uring registered buffers: a long-term pin like the CUDA
// driver's, which makes the kernel copy pinned anonymous pages into the child at fork); cuda
// (cuMemHostRegister, portable and mapped, through libcuda.so.1 opened at run time: the GPU run).
//
//   gcc -O2 -o fork_probe benches/archive/fork_probe.c -ldl
//   ./fork_probe [--pin none|uring|cuda] [--mech anon,shared,dontfork] [--reps N] GiB...
//
// One line per (mechanism, size, repetition): the parent's fork() time, the child's remap time,
// its Private_Dirty (smaps_rollup) after the remap and after reading every byte, the time of that
// read pass, whether it read the parent's data, and whether its writes stayed private.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile uint64_t sink;

static double private_dirty_mib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    double kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "Private_Dirty: %lf kB", &kib) == 1) break;
    if (f) fclose(f);
    return kib / 1024;
}

// ---- pinning -----------------------------------------------------------------------------
enum pin { PIN_NONE, PIN_URING, PIN_CUDA };
static int ring_fd = -1;
typedef int (*cu_fn)();
static cu_fn cu_register, cu_unregister;

static void pin_setup(enum pin p) {
    if (p == PIN_CUDA) {
        void *lib = dlopen("libcuda.so.1", RTLD_NOW);
        if (!lib) {
            printf("skipped: no libcuda.so.1 (%s)\n", dlerror());
            exit(0);
        }
        cu_fn init = (cu_fn)dlsym(lib, "cuInit"), get = (cu_fn)dlsym(lib, "cuDeviceGet");
        cu_fn retain = (cu_fn)dlsym(lib, "cuDevicePrimaryCtxRetain");
        cu_fn set = (cu_fn)dlsym(lib, "cuCtxSetCurrent");
        cu_register = (cu_fn)dlsym(lib, "cuMemHostRegister_v2");
        cu_unregister = (cu_fn)dlsym(lib, "cuMemHostUnregister");
        int dev = 0;
        void *ctx = 0;
        if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) {
            printf("skipped: CUDA did not initialise\n");
            exit(0);
        }
    }
}

static int pin(enum pin p, void *addr, size_t size) {
    if (p == PIN_CUDA) return cu_register(addr, size, 1u | 2u); // PORTABLE | DEVICEMAP
    if (p != PIN_URING) return 0;
    struct io_uring_params params = {0};
    ring_fd = (int)syscall(SYS_io_uring_setup, 4, &params);
    if (ring_fd < 0) return -1;
    // One buffer may be at most 1 GiB.
    size_t n = (size + (1ul << 30) - 1) >> 30;
    struct iovec *v = calloc(n, sizeof *v);
    for (size_t i = 0; i < n; i++) {
        v[i].iov_base = (char *)addr + (i << 30);
        v[i].iov_len = size - (i << 30) < (1ul << 30) ? size - (i << 30) : (1ul << 30);
    }
    int rc = (int)syscall(SYS_io_uring_register, ring_fd, IORING_REGISTER_BUFFERS, v, (unsigned)n);
    free(v);
    return rc;
}

static void unpin(enum pin p, void *addr) {
    if (p == PIN_CUDA) cu_unregister(addr);
    if (p == PIN_URING && ring_fd >= 0) close(ring_fd), ring_fd = -1;
}

// ---- one measurement ---------------------------------------------------------------------
struct child_report {
    double remap_ms, dirty_after_remap, read_ms, dirty_after_read, dirty_after_writes;
    int read_ok;
};

static void run(const char *mech, size_t size, enum pin p) {
    int shared = strcmp(mech, "anon") != 0, dontfork = strcmp(mech, "dontfork") == 0;
    int fd = -1;
    char *a;
    double t0 = now();
    if (shared) {
        fd = memfd_create("fork-probe", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, 1l << 47) != 0) return perror("memfd");
        a = mmap(0, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        a = mmap(a, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)(uintptr_t)a);
    } else {
        a = mmap(0, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (a != MAP_FAILED) madvise(a, size, MADV_HUGEPAGE);
    }
    if (a == MAP_FAILED) return perror("mmap");
    uint64_t *w = (uint64_t *)a;
    size_t n = size / 8;
    for (size_t i = 0; i < n; i++) w[i] = i * 2654435761u;
    double fill_ms = (now() - t0) * 1e3;
    t0 = now();
    if (pin(p, a, size) != 0) {
        printf("%-8s %5.1f GiB: pinning failed\n", mech, size / 1073741824.0);
        return;
    }
    double pin_ms = (now() - t0) * 1e3;
    // A NumPy-like pass (multiply-add in place, then undo) on the memory as mapped.
    t0 = now();
    for (size_t i = 0; i < n; i++) w[i] = w[i] * 3 + 1;
    double pass_ms = (now() - t0) * 1e3;
    for (size_t i = 0; i < n; i++) w[i] = i * 2654435761u;
    if (dontfork) madvise(a, size, MADV_DONTFORK);

    int pipefd[2];
    if (pipe(pipefd) != 0) return perror("pipe");
    t0 = now();
    pid_t pid = fork();
    double fork_ms = (now() - t0) * 1e3;
    if (pid == 0) {
        struct child_report r = {0};
        double c0 = now();
        if (shared) {
            void *m = mmap(a, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE,
                           fd, (off_t)(uintptr_t)a);
            if (m != a) _exit(3);
        }
        r.remap_ms = (now() - c0) * 1e3;
        r.dirty_after_remap = private_dirty_mib();
        c0 = now();
        uint64_t s = 0, want = 0;
        for (size_t i = 0; i < n; i++) s += w[i], want += i * 2654435761u;
        sink = s;
        r.read_ms = (now() - c0) * 1e3;
        r.read_ok = s == want;
        r.dirty_after_read = private_dirty_mib();
        for (size_t i = 0; i < n; i += (2 << 20) / 8) w[i] = ~0ull; // one word per 2 MiB
        r.dirty_after_writes = private_dirty_mib();
        ssize_t wr = write(pipefd[1], &r, sizeof r);
        _exit(wr == sizeof r ? 0 : 4);
    }
    struct child_report r = {0};
    ssize_t got = read(pipefd[0], &r, sizeof r);
    int status = 0;
    waitpid(pid, &status, 0);
    close(pipefd[0]);
    close(pipefd[1]);
    int private_ok = 1;
    for (size_t i = 0; i < n; i += (2 << 20) / 8) private_ok &= w[i] == i * 2654435761u;
    printf("%-8s %5.1f GiB  fill %7.0f ms  pin %6.0f ms  pass %6.0f ms | fork %8.2f ms | child: "
           "remap %6.2f ms, dirty %7.1f MiB, read %6.0f ms (%s), dirty %7.1f MiB, after writes "
           "%6.1f MiB | writes %s%s\n",
           mech, size / 1073741824.0, fill_ms, pin_ms, pass_ms, fork_ms, r.remap_ms,
           r.dirty_after_remap, r.read_ms, r.read_ok ? "right" : "WRONG", r.dirty_after_read,
           r.dirty_after_writes, private_ok ? "private" : "LEAKED TO THE PARENT",
           got == sizeof r && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : " (child failed)");
    fflush(stdout);
    unpin(p, a);
    munmap(a, size);
    if (fd >= 0) close(fd);
}

int main(int argc, char **argv) {
    enum pin p = PIN_NONE;
    const char *mechs = "anon,shared,dontfork";
    int reps = 1;
    double sizes[16];
    int nsizes = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--pin") && i + 1 < argc) {
            const char *v = argv[++i];
            p = !strcmp(v, "uring") ? PIN_URING : !strcmp(v, "cuda") ? PIN_CUDA : PIN_NONE;
        } else if (!strcmp(argv[i], "--mech") && i + 1 < argc) {
            mechs = argv[++i];
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--pin none|uring|cuda] [--mech anon,shared,dontfork] [--reps N] "
                   "GiB...\n",
                   argv[0]);
            return 0;
        } else if (nsizes < 16) {
            sizes[nsizes++] = atof(argv[i]);
        }
    }
    if (!nsizes) sizes[nsizes++] = 2;
    pin_setup(p);
    printf("pinning: %s\n", p == PIN_CUDA ? "cuMemHostRegister" : p == PIN_URING ? "io_uring" : "none");
    for (int s = 0; s < nsizes; s++)
        for (int r = 0; r < reps; r++) {
            char buf[64];
            snprintf(buf, sizeof buf, "%s", mechs);
            for (char *m = strtok(buf, ","); m; m = strtok(0, ","))
                run(m, (size_t)(sizes[s] * 1073741824.0), p);
        }
    return 0;
}
