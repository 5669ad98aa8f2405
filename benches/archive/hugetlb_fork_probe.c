/* Could the pinned host side's memory file (issue 20: a memfd mapped MAP_SHARED, remapped
 * MAP_PRIVATE from the file in every fork child) be made of reserved hugetlb pages, where a
 * machine has them (issue 35)? A hugetlb memfd of MIB MiB is filled by the parent; a fork child
 * remaps it MAP_PRIVATE|MAP_FIXED from the file, as ump-alloc's child handler does, reads every
 * page and writes every page. Prints the kernel's free and reserved huge pages at each step, and
 * how the child ended. Also tries a 4 KiB hole punch (how the pool gives back free pages).
 *
 *   cc -O2 -o /tmp/hugetlb_fork_probe benches/archive/hugetlb_fork_probe.c
 *   echo 8 > /proc/sys/vm/nr_hugepages          # root: reserve eight 2 MiB pages
 *   /tmp/hugetlb_fork_probe MIB [noreserve]     # e.g. 8, 16, 16 noreserve
 *   echo 0 > /proc/sys/vm/nr_hugepages
 *
 * "noreserve" adds MAP_NORESERVE to the child's remap. Needs no GPU.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void show(const char *when) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "HugePages_Free", 14) || !strncmp(line, "HugePages_Rsvd", 14))
            printf("  %-18s %s", when, line);
    if (f)
        fclose(f);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MIB [noreserve]\n", argv[0]);
        return 2;
    }
    size_t len = (size_t)atoi(argv[1]) << 20;
    int noreserve = argc > 2 && !strcmp(argv[2], "noreserve");
    int fd = memfd_create("ump-hugetlb-probe", MFD_HUGETLB);
    if (fd < 0 || ftruncate(fd, (off_t)len)) {
        perror("memfd_create(MFD_HUGETLB) / ftruncate");
        return 1;
    }
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        perror("mmap MAP_SHARED");
        return 1;
    }
    memset(p, 7, len);
    show("parent, filled:");
    int punched = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 4096, 4096);
    show(punched ? "punch 4 KiB: fails" : "punch 4 KiB:");
    pid_t pid = fork();
    if (pid == 0) {
        int flags = MAP_PRIVATE | MAP_FIXED | (noreserve ? MAP_NORESERVE : 0);
        char *q = mmap(p, len, PROT_READ | PROT_WRITE, flags, fd, 0);
        if (q == MAP_FAILED) {
            perror("  child: remap MAP_PRIVATE");
            _exit(3);
        }
        show("child, remapped:");
        long sum = 0;
        for (size_t i = 0; i < len; i += 4096)
            sum += q[i];
        printf("  child read every page (sum %ld)\n", sum);
        fflush(stdout);
        memset(q, 9, len);
        show("child, written:");
        _exit(0);
    }
    int st;
    waitpid(pid, &st, 0);
    if (WIFSIGNALED(st))
        printf("  child killed by signal %d\n", WTERMSIG(st));
    else
        printf("  child exit %d\n", WEXITSTATUS(st));
    printf("  parent still reads %d\n", p[0]);
    return 0;
}
