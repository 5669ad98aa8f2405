/* What a fork() child pays on its first read of the parent's memory, by kind of page: the
 * pinned host side's memory-file pages (mapped shared in the parent, kept out of the fork,
 * mapped again private from the file in the child, as ump-alloc does; 2 MiB-aligned and
 * advised MADV_HUGEPAGE, so the kernel makes them huge where shmem_enabled allows), against
 * anonymous memory inherited through the page tables fork copies, with huge pages (NumPy's own
 * large arrays where THP is `madvise`) and with 4 KiB pages. No GPU: registration does not
 * change any of this.
 *
 *   gcc -O2 -o fork_first_touch_probe benches/archive/fork_first_touch_probe.c
 *   ./fork_first_touch_probe [MiB=1024] [rounds=3]
 *
 * Each line: the child's first and second full read (8-byte sums) and their difference per
 * GiB, i.e. the cost of the first touch. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long sum(const long *q, size_t n) {
    long s = 0;
    for (size_t i = 0; i < n / sizeof(long); i++) s += q[i];
    return s;
}

static char *aligned_reservation(size_t n) {
    size_t huge = 2u << 20;
    char *r = mmap(NULL, n + huge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return NULL;
    return (char *)(((unsigned long)r + huge - 1) & ~(huge - 1));
}

int main(int argc, char **argv) {
    size_t n = (size_t)(argc > 1 ? atoi(argv[1]) : 1024) << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    int fd = memfd_create("ump-probe", 0);
    char *at = aligned_reservation(n);
    if (fd < 0 || ftruncate(fd, n) != 0 || at == NULL) return perror("setup"), 1;
    char *file = mmap(at, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    char *thp = aligned_reservation(n), *small = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (file == MAP_FAILED || thp == NULL || small == MAP_FAILED) return perror("mmap"), 1;
    thp = mmap(thp, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    madvise(file, n, MADV_HUGEPAGE);
    madvise(file, n, MADV_DONTFORK);
    madvise(thp, n, MADV_HUGEPAGE);
    madvise(small, n, MADV_NOHUGEPAGE);
    memset(file, 1, n);
    memset(thp, 1, n);
    memset(small, 1, n);
    FILE *sh = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
    char setting[128] = "?";
    if (sh) {
        if (!fgets(setting, sizeof setting, sh)) strcpy(setting, "?\n");
        fclose(sh);
    }
    printf("%zu MiB; shmem_enabled: %s", n >> 20, setting);
    const char *names[] = {"memory file, remapped private", "anonymous, huge pages", "anonymous, 4 KiB pages"};
    for (int r = 0; r < rounds; r++)
        for (int kind = 0; kind < 3; kind++) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                char *q = kind == 1 ? thp : kind == 2 ? small : mmap(file, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
                if (q == MAP_FAILED) _exit(2);
                double t0 = now();
                long a = sum((long *)q, n);
                double t1 = now();
                long b = sum((long *)q, n);
                double t2 = now();
                double gib = n / 1073741824.0;
                printf("%-30s first read %7.1f ms, second %7.1f ms: first touch %6.1f ms per GiB%s\n", names[kind],
                       (t1 - t0) * 1e3, (t2 - t1) * 1e3, ((t1 - t0) - (t2 - t1)) * 1e3 / gib,
                       a == b && a == (long)(n / sizeof(long)) * 0x0101010101010101L ? "" : "  WRONG DATA");
                fflush(stdout);
                _exit(0);
            }
            int status = 0;
            waitpid(pid, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return fprintf(stderr, "child failed\n"), 1;
        }
    return 0;
}
