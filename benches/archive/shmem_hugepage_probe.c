/* Can the pages of a memory file (the pinned host side's shared pages, issue 20) be huge pages
 * on this kernel? A memfd mapped MAP_SHARED at a 2 MiB boundary and advised MADV_DONTFORK, as
 * ump-alloc maps its chunks, then one of three advices before the pages are touched:
 *
 *   0  none
 *   1  MADV_COLLAPSE (Linux 6.1+: make huge pages now)
 *   2  MADV_HUGEPAGE (what ump-alloc's pinned chunks get)
 *
 * It fills the range, prints how much of this process's memory is mapped with huge pages
 * (ShmemPmdMapped / FilePmdMapped / AnonHugePages of /proc/self/smaps_rollup), times three
 * passes of x *= 3 over it as float32, and forks a child that maps the range again MAP_PRIVATE
 * from the file (as ump-alloc's child handler does) and reads it all. Needs no GPU.
 *
 *   cc -O2 -o /tmp/shmem_hugepage_probe benches/archive/shmem_hugepage_probe.c
 *   /tmp/shmem_hugepage_probe MIB ADVICE       (e.g. 1024 1)
 *
 * Prints the kernel's answer to the advice as "advice rc=R errno=E"; EINVAL (22) for
 * MADV_COLLAPSE means the kernel refuses huge pages for this file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HUGE ((size_t)2 << 20)
#define MADV_COLLAPSE_ 25 /* include/uapi/asm-generic/mman-common.h */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void smaps(const char *who) {
    char line[256];
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return;
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "PmdMapped") || strstr(line, "Private_Dirty") || strstr(line, "AnonHuge"))
            printf("%s %s", who, line);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s MIB ADVICE (0 none, 1 MADV_COLLAPSE, 2 MADV_HUGEPAGE)\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[1]) << 20;
    int advice = atoi(argv[2]);
    int fd = memfd_create("shmem-hugepage-probe", MFD_CLOEXEC);
    /* Sparse and long enough that a mapping's file offset can be its address, as ump-alloc's. */
    if (fd < 0 || ftruncate(fd, (off_t)1 << 48) != 0) {
        perror("memfd");
        return 1;
    }
    char *reserve = mmap(NULL, n + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (reserve == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    char *a = (char *)(((size_t)reserve + HUGE - 1) & ~(HUGE - 1));
    if (mmap(a, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)(size_t)a) != a) {
        perror("mmap shared");
        return 1;
    }
    madvise(a, n, MADV_DONTFORK);

    double t = now();
    int rc = advice == 1 ? madvise(a, n, MADV_COLLAPSE_) : advice == 2 ? madvise(a, n, MADV_HUGEPAGE) : 0;
    printf("advice %d rc=%d errno=%d %.1f ms\n", advice, rc, rc ? errno : 0, (now() - t) * 1e3);
    t = now();
    memset(a, 1, n);
    printf("fill %.1f ms\n", (now() - t) * 1e3);
    smaps("parent");

    float *v = (float *)a;
    size_t m = n / sizeof(float);
    t = now();
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < m; i++) v[i] *= 3;
    printf("mul x3 %.1f ms\n", (now() - t) * 1e3);
    fflush(stdout);

    pid_t child = fork();
    if (child == 0) {
        if (mmap(a, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED | MAP_NORESERVE, fd, (off_t)(size_t)a) != a)
            _exit(3);
        double sum = 0;
        t = now();
        for (size_t i = 0; i < m; i++) sum += v[i];
        printf("child read %.1f ms (sum %g)\n", (now() - t) * 1e3, sum);
        smaps("child");
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
