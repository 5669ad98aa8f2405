/* Shared by the C regression programs (test_reliability.c, test_review.c): the check
 * machinery, process measurements and the scenario runner. Each program is one process per
 * scenario: `prog SCENARIO` runs it, prints "<program> <scenario>: N passed, M failed" and exits
 * non-zero if M > 0. */
#ifndef UMP_TEST_HARNESS_H
#define UMP_TEST_HARNESS_H

#include "ump_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- check machinery ------------------------------------------------------------------ */

static atomic_ulong g_pass;
static atomic_ulong g_fail;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            atomic_fetch_add(&g_pass, 1);                                  \
        } else {                                                           \
            atomic_fetch_add(&g_fail, 1);                                  \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
        }                                                                  \
    } while (0)

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * 1024)
#define GiB ((size_t)1024 * 1024 * 1024)
#define MB(x) ((double)(x) / (double)MiB)

static inline const char *last_err_or(const char *dflt) {
    const char *e = ump_last_error();
    return e ? e : dflt;
}

static inline int is_aligned(const void *p, size_t a) {
    return a != 0 && ((uintptr_t)p % a) == 0;
}

static inline int identify(const void *p, struct ump_identity *id) {
    memset(id, 0, sizeof *id);
    id->size = (uint32_t)sizeof(struct ump_identity);
    return ump_identify(p, id);
}

static inline void stats_now(struct ump_stats *st) {
    memset(st, 0xAB, sizeof *st); /* poison: every field must be written */
    st->size = (uint32_t)sizeof *st;
    CHECK(ump_stats(st) == UMP_OK, "ump_stats failed: %s", last_err_or("?"));
    CHECK(st->size == sizeof *st && st->version == UMP_STATS_VERSION,
          "ump_stats: size %u version %u", st->size, st->version);
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Virtual size and resident size of this process in bytes, from /proc/self/statm. Plain
 * open/read into a stack buffer: no heap use (registry-oom measures around it). */
static inline int statm(size_t *vsize, size_t *rss) {
    char buf[256];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    unsigned long long v = 0, r = 0;
    if (sscanf(buf, "%llu %llu", &v, &r) != 2) return -1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (vsize) *vsize = (size_t)v * page;
    if (rss) *rss = (size_t)r * page;
    return 0;
}

static inline size_t rss_now(void) {
    size_t r = 0;
    statm(NULL, &r);
    return r;
}

/* ---- patterns and randomness --------------------------------------------------------------- */

#include "patterns.h"

static inline uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* ---- the scenario runner ---------------------------------------------------------------------- */

struct scenario {
    const char *name;
    void (*run)(void);
};

/* Run the scenario named by argv[1] among `list` (`n` of them); `program` names the summary. */
static inline int run_scenario(const char *program, const struct scenario *list, size_t n,
                               int argc, char **argv) {
    size_t i;
    if (argc != 2) {
        fprintf(stderr, "usage: %s SCENARIO\nscenarios:", argv[0]);
        for (i = 0; i < n; i++) fprintf(stderr, " %s", list[i].name);
        fputc('\n', stderr);
        return 2;
    }
    for (i = 0; i < n; i++)
        if (strcmp(argv[1], list[i].name) == 0) break;
    if (i == n) {
        fprintf(stderr, "unknown scenario '%s'\n", argv[1]);
        return 2;
    }
    double t0 = now_s();
    list[i].run();
    unsigned long pass = atomic_load(&g_pass), fail = atomic_load(&g_fail);
    printf("%s %s: %lu passed, %lu failed (%.1f s)\n", program, argv[1], pass, fail,
           now_s() - t0);
    fflush(stdout);
    return fail > 0 ? 1 : 0;
}

#endif
