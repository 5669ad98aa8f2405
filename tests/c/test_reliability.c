/* Reliability regression tests of libump_alloc, through the public C API only.
 *
 * Each scenario is a bug that was fixed; each runs as its own process, because several need
 * their own UMP_ALLOC_* environment (see run.sh next to this file):
 *
 *   test_reliability stale-free-vs-trim   frees of stale pointers racing with ump_trim
 *   test_reliability fork-churn           fork() while two threads allocate and free
 *   test_reliability burst-retain         UMP_ALLOC_HOST_RETAIN=256M bounds a freed 2 GiB burst
 *   test_reliability limit-after-free     UMP_ALLOC_LIMIT=512M: cached memory does not block
 *   test_reliability idle-thread-cache    ump_trim empties an idle thread's cache
 *   test_reliability retain-8mib          default retain bounds freed 8 MiB blocks
 *   test_reliability retain-zero          UMP_ALLOC_HOST_RETAIN=0 gives back freed slabs
 *   test_reliability registry-oom         no memory for a registry leaf (plain build only)
 *   test_reliability small-alignment      small blocks get their natural alignment
 *   test_reliability messages             ump_last_error texts; nothing on stderr
 *
 * UMP_TEST_ITERS=N sets the iterations of stale-free-vs-trim (default 200000).
 * Expects a machine without a usable GPU (mode "host"). Prints FAIL lines on stderr and one
 * summary line "reliability <scenario>: N passed, M failed"; exits non-zero if M > 0.
 */

#define _GNU_SOURCE

#include "harness.h"

/* A size in [lo, hi], log-uniform (every octave about equally likely). */
static size_t log_uniform(uint64_t *rng, size_t lo, size_t hi) {
    int octaves = 0;
    size_t s;
    for (s = lo; s < hi; s *= 2) octaves++;
    uint64_t r = xorshift(rng);
    size_t base = lo << (r % (uint64_t)(octaves + 1));
    size_t n = base + (size_t)((r >> 8) % (uint64_t)base);
    if (n > hi) n = hi;
    if (n < lo) n = lo;
    return n;
}

struct blk {
    unsigned char *p;
    size_t n;
    uint64_t seed;
};

static int blk_by_addr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const struct blk *)a)->p, y = (uintptr_t)((const struct blk *)b)->p;
    return x < y ? -1 : x > y;
}

/* Allocate `count` blocks of mixed sizes in [lo, hi], each filled with its own pattern; check
 * that no two overlap, that each is ours (ump_identify), that every pattern reads back after
 * all were written, and that host in_use is exactly their sum; then free them. */
static void mixed_workload(const char *label, int count, size_t lo, size_t hi, uint64_t seed) {
    struct blk *b = (struct blk *)calloc((size_t)count, sizeof *b);
    uint64_t rng = seed | 1;
    size_t total = 0;
    int i, got = 0, bad_id = 0, bad_pat = 0, overlaps = 0;
    struct ump_stats st0, st1;
    CHECK(b != NULL, "%s: calloc of the block table failed", label);
    if (!b) return;
    stats_now(&st0);
    for (i = 0; i < count; i++) {
        size_t n = log_uniform(&rng, lo, hi);
        unsigned char *p = (unsigned char *)ump_malloc(n);
        if (!p) {
            CHECK(0, "%s: ump_malloc(%zu) #%d returned NULL: %s", label, n, i, last_err_or("-"));
            continue;
        }
        b[got].p = p;
        b[got].n = n;
        b[got].seed = mix64(seed + (uint64_t)i);
        fill_pattern(p, n, b[got].seed);
        total += n;
        got++;
    }
    stats_now(&st1);
    CHECK(st1.host.in_use == st0.host.in_use + total,
          "%s: host in_use %" PRIu64 " after allocating %zu bytes on top of %" PRIu64
          " (want exactly the sum; a counter that went below zero earlier shows here)",
          label, st1.host.in_use, total, st0.host.in_use);
    for (i = 0; i < got; i++) {
        struct ump_identity id;
        if (identify(b[i].p + b[i].n / 2, &id) != UMP_OK || !id.ours ||
            id.base != (size_t)(uintptr_t)b[i].p || id.block_size != b[i].n) {
            if (bad_id++ < 5)
                CHECK(0, "%s: ump_identify(%zu-byte block %p): ours %d base %#zx size %zu", label,
                      b[i].n, (void *)b[i].p, id.ours, id.base, id.block_size);
        }
    }
    qsort(b, (size_t)got, sizeof *b, blk_by_addr);
    for (i = 0; i + 1 < got; i++) {
        if ((uintptr_t)b[i].p + b[i].n > (uintptr_t)b[i + 1].p) {
            if (overlaps++ < 5)
                CHECK(0, "%s: blocks overlap: %p+%zu and %p+%zu", label, (void *)b[i].p, b[i].n,
                      (void *)b[i + 1].p, b[i + 1].n);
        }
    }
    for (i = 0; i < got; i++) {
        size_t off = check_pattern(b[i].p, b[i].n, b[i].seed);
        if (off != SIZE_MAX && bad_pat++ < 5)
            CHECK(0, "%s: %zu-byte block %p: byte %zu does not read back (overwritten)", label,
                  b[i].n, (void *)b[i].p, off);
    }
    CHECK(bad_id == 0 && overlaps == 0 && bad_pat == 0,
          "%s: %d identify failures, %d overlaps, %d damaged blocks among %d", label, bad_id,
          overlaps, bad_pat, got);
    uint64_t e0 = ump_error_count();
    for (i = 0; i < got; i++) ump_free(b[i].p, b[i].n);
    CHECK(ump_error_count() == e0, "%s: freeing the workload counted %" PRIu64 " errors: %s",
          label, ump_error_count() - e0, last_err_or("-"));
    fprintf(stderr, "note: %s: %d blocks, %.1f MiB, no overlap, patterns intact\n", label, got,
            MB(total));
    free(b);
}

/* ---- 1. stale frees racing with ump_trim --------------------------------------------------- */

/* A sane bound for host in_use here: at most one live block of thread A plus the thread caches'
 * batched counts (256 KiB per thread). A counter that wrapped below zero reads as ~2^64. */
#define S1_IN_USE_BOUND (64 * MiB)

static _Atomic(uintptr_t) s1_pub;
static atomic_int s1_done;
static atomic_ulong s1_a_frees, s1_a_mallocs, s1_a_null, s1_b_frees;

static void *s1_thread_a(void *arg) {
    long iters = *(long *)arg, i;
    static const size_t sizes[] = {100000, 300000, 2000}; /* slab, span, slab */
    for (i = 0; i < iters; i++) {
        size_t n = sizes[i % 3];
        void *p = ump_malloc(n);
        if (!p) {
            atomic_fetch_add(&s1_a_null, 1);
            continue;
        }
        atomic_fetch_add(&s1_a_mallocs, 1);
        atomic_store(&s1_pub, (uintptr_t)p);
        ump_free(p, 0);
        atomic_fetch_add(&s1_a_frees, 1);
        (void)ump_trim();
    }
    atomic_store(&s1_done, 1);
    return NULL;
}

static void *s1_thread_b(void *arg) {
    (void)arg;
    unsigned long n = 0;
    while (!atomic_load(&s1_done)) {
        uintptr_t p = atomic_load(&s1_pub);
        if (p == 0) continue;
        ump_free((void *)p, 0);
        n++;
    }
    atomic_store(&s1_b_frees, n);
    return NULL;
}

static void scenario_stale_free_vs_trim(void) {
    long iters = 200000;
    const char *env = getenv("UMP_TEST_ITERS");
    if (env && *env) iters = atol(env);
    struct ump_stats st0, st;
    stats_now(&st0);
    uint64_t e0 = ump_error_count();
    uint64_t max_in_use = 0, samples = 0;
    pthread_t ta, tb;
    double t0 = now_s();
    int ra = pthread_create(&ta, NULL, s1_thread_a, &iters);
    int rb = pthread_create(&tb, NULL, s1_thread_b, NULL);
    CHECK(ra == 0 && rb == 0, "pthread_create failed: %d %d", ra, rb);
    if (ra != 0) atomic_store(&s1_done, 1);
    while (!atomic_load(&s1_done)) {
        stats_now(&st);
        samples++;
        if (st.host.in_use > max_in_use) max_in_use = st.host.in_use;
        sleep_ms(2);
    }
    if (ra == 0) pthread_join(ta, NULL);
    if (rb == 0) pthread_join(tb, NULL);
    double dt = now_s() - t0;
    stats_now(&st);
    if (st.host.in_use > max_in_use) max_in_use = st.host.in_use;

    unsigned long a_frees = atomic_load(&s1_a_frees), b_frees = atomic_load(&s1_b_frees);
    unsigned long mallocs = atomic_load(&s1_a_mallocs), nulls = atomic_load(&s1_a_null);
    uint64_t errs = ump_error_count() - e0;
    fprintf(stderr,
            "note: %ld iterations in %.1f s: %lu mallocs, A freed %lu, B freed %lu, %" PRIu64
            " frees refused (%" PRIu64 " double, %" PRIu64 " invalid), max host in_use %" PRIu64
            " over %" PRIu64 " samples\n",
            iters, dt, mallocs, a_frees, b_frees, errs,
            st.errors_double_free - st0.errors_double_free,
            st.errors_invalid_free - st0.errors_invalid_free, max_in_use, samples);
    CHECK(nulls == 0, "thread A: %lu ump_malloc calls returned NULL", nulls);
    CHECK(errs > 0, "no stale free was refused (error count did not grow; B freed %lu times)",
          b_frees);
    /* Every block is freed successfully exactly once, whoever frees it; every other free is
     * refused and counted. A stale free that is wrongly accepted makes this smaller. */
    CHECK(errs == (uint64_t)(a_frees + b_frees) - mallocs,
          "refused frees %" PRIu64 " != frees tried %lu - blocks %lu = %lu (a block was freed "
          "twice, or a live block's free was refused)",
          errs, a_frees + b_frees, mallocs, a_frees + b_frees - mallocs);
    CHECK(max_in_use <= S1_IN_USE_BOUND,
          "host in_use reached %" PRIu64 " during the race (bound %zu; a wrapped counter?)",
          max_in_use, S1_IN_USE_BOUND);
    CHECK(st.host.in_use == st0.host.in_use,
          "host in_use %" PRIu64 " after the race, was %" PRIu64 " (every block was freed)",
          st.host.in_use, st0.host.in_use);
    CHECK(st.host.allocs - st0.host.allocs == st.host.frees - st0.host.frees,
          "host allocs +%" PRIu64 " but frees +%" PRIu64 " (every block freed once)",
          st.host.allocs - st0.host.allocs, st.host.frees - st0.host.frees);
    CHECK(st.host.allocs - st0.host.allocs == mallocs,
          "host allocs +%" PRIu64 ", want %lu", st.host.allocs - st0.host.allocs, mallocs);

    /* Afterwards the pool must still hand out sound memory. */
    mixed_workload("after the race", 2000, 64, 4 * MiB, 0x5eed);
    stats_now(&st);
    CHECK(st.host.in_use <= S1_IN_USE_BOUND && st.host.in_use == st0.host.in_use,
          "host in_use %" PRIu64 " at the end", st.host.in_use);
}

/* ---- 2. fork() while other threads allocate ------------------------------------------------ */

#define S2_FORKS 100
#define S2_LIVE 16
#define S2_CHILD_TIMEOUT_S 20.0

static atomic_int s2_stop;
static atomic_long s2_ops;
static atomic_long s2_null, s2_damaged;

/* First and last byte of a churn block (the same byte for a 1-byte block). */
static unsigned char s2_first(const struct blk *b) {
    return b->n == 1 ? (unsigned char)(b->seed >> 8) : (unsigned char)b->seed;
}

static void *s2_churn(void *arg) {
    uint64_t rng = UINT64_C(0x9E3779B97F4A7C15) * (uint64_t)((intptr_t)arg + 3);
    struct blk live[S2_LIVE];
    int nlive = 0;
    while (!atomic_load(&s2_stop)) {
        uint64_t r = xorshift(&rng);
        if (nlive == S2_LIVE || (nlive > 0 && (r & 1))) {
            int k = (int)((r >> 1) % (uint64_t)nlive);
            struct blk *b = &live[k];
            if (b->p[0] != s2_first(b) || b->p[b->n - 1] != (unsigned char)(b->seed >> 8))
                atomic_fetch_add(&s2_damaged, 1);
            ump_free(b->p, b->n);
            live[k] = live[--nlive];
        } else {
            size_t n = log_uniform(&rng, 1, 40 * MiB);
            unsigned char *p = (unsigned char *)ump_malloc(n);
            if (!p) {
                atomic_fetch_add(&s2_null, 1);
                continue;
            }
            uint64_t seed = xorshift(&rng);
            p[0] = (unsigned char)seed;
            p[n - 1] = (unsigned char)(seed >> 8);
            live[nlive].p = p;
            live[nlive].n = n;
            live[nlive].seed = seed;
            nlive++;
        }
        atomic_fetch_add(&s2_ops, 1);
    }
    while (nlive > 0) {
        nlive--;
        ump_free(live[nlive].p, live[nlive].n);
    }
    return NULL;
}

/* The child: allocate, write, read, free, trim. Exit status 0, or which step failed. */
static void s2_child(void) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* a hung child must not outlive a killed parent */
    unsigned char *a = (unsigned char *)ump_malloc(1000);
    unsigned char *b = (unsigned char *)ump_malloc(1 * MiB);
    if (!a || !b) _exit(10);
    fill_pattern(a, 1000, 1);
    fill_pattern(b, 1 * MiB, 2);
    if (check_pattern(a, 1000, 1) != SIZE_MAX) _exit(11);
    if (check_pattern(b, 1 * MiB, 2) != SIZE_MAX) _exit(12);
    uint64_t e0 = ump_error_count();
    ump_free(a, 1000);
    ump_free(b, 1 * MiB);
    if (ump_error_count() != e0) _exit(13);
    (void)ump_trim();
    _exit(0);
}

static volatile sig_atomic_t s2_child_pid;

static void on_watchdog(int sig) {
    (void)sig;
    static const char msg[] = "test_reliability: FAIL: watchdog (alarm) fired: a hang\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    if (s2_child_pid > 0) kill((pid_t)s2_child_pid, SIGKILL);
    _exit(3);
}

static void scenario_fork_churn(void) {
    signal(SIGALRM, on_watchdog);
    alarm(120);
    pthread_t th[2];
    int i, started[2], ok = 0, hung = 0, bad = 0;
    double worst = 0.0, t0 = now_s();
    for (i = 0; i < 2; i++) {
        started[i] = pthread_create(&th[i], NULL, s2_churn, (void *)(intptr_t)i) == 0;
        CHECK(started[i], "pthread_create %d failed", i);
    }
    while (atomic_load(&s2_ops) < 1000) sleep_ms(1); /* both threads busy */
    for (i = 0; i < S2_FORKS; i++) {
        fflush(stdout);
        fflush(stderr);
        double tf = now_s();
        pid_t pid = fork();
        if (pid == 0) s2_child();
        s2_child_pid = pid;
        if (pid < 0) {
            CHECK(0, "fork #%d failed: %s", i, strerror(errno));
            break;
        }
        int status = 0;
        pid_t w = 0;
        while ((w = waitpid(pid, &status, WNOHANG)) == 0 && now_s() - tf < S2_CHILD_TIMEOUT_S)
            sleep_ms(1);
        s2_child_pid = 0;
        double took = now_s() - tf;
        if (took > worst) worst = took;
        if (w == 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            hung++;
            CHECK(0, "fork #%d: child %d did not exit within %.0f s (deadlock?); killed; no "
                  "more forks", i, (int)pid, S2_CHILD_TIMEOUT_S);
            s2_child_pid = 0;
            break;
        } else if (w == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            ok++;
        } else {
            if (bad++ < 5)
                CHECK(0, "fork #%d: child %s %d (10: malloc NULL, 11/12: pattern, 13: free error)",
                      i, WIFSIGNALED(status) ? "killed by signal" : "exit status",
                      WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
        }
    }
    atomic_store(&s2_stop, 1);
    for (i = 0; i < 2; i++)
        if (started[i]) pthread_join(th[i], NULL);
    alarm(0);
    fprintf(stderr,
            "note: %d/%d children exited 0 (%d hung, %d failed); slowest child %.3f s; "
            "%ld churn operations in %.1f s\n",
            ok, S2_FORKS, hung, bad, worst, atomic_load(&s2_ops), now_s() - t0);
    CHECK(ok == S2_FORKS, "%d of %d fork children exited 0", ok, S2_FORKS);
    CHECK(atomic_load(&s2_null) == 0, "churn threads: %ld ump_malloc calls returned NULL",
          atomic_load(&s2_null));
    CHECK(atomic_load(&s2_damaged) == 0, "churn threads: %ld blocks lost their first/last byte",
          atomic_load(&s2_damaged));
    struct ump_stats st;
    stats_now(&st);
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64 " after the churn (all freed)",
          st.host.in_use);
}

/* ---- 3. a freed burst is bounded by UMP_ALLOC_HOST_RETAIN ----------------------------------- */

#define S3_BLOCK 4096
#define S3_COUNT ((size_t)524288) /* 2 GiB */
#define S3_RETAIN (256 * MiB)

static void scenario_burst_retain(void) {
    unsigned char **ptrs = (unsigned char **)malloc(S3_COUNT * sizeof *ptrs);
    CHECK(ptrs != NULL, "malloc of the pointer table failed");
    if (!ptrs) return;
    memset(ptrs, 0, S3_COUNT * sizeof *ptrs); /* resident before the baseline */
    size_t rss0 = rss_now(), i, got = 0;
    struct ump_stats st;
    for (i = 0; i < S3_COUNT; i++) {
        ptrs[i] = (unsigned char *)ump_malloc(S3_BLOCK);
        if (!ptrs[i]) {
            CHECK(0, "ump_malloc(4096) #%zu returned NULL: %s", i, last_err_or("-"));
            break;
        }
        ptrs[i][0] = (unsigned char)i; /* touch: the block becomes resident */
        got++;
    }
    stats_now(&st);
    size_t rss_peak = rss_now();
    uint64_t mapped_peak = st.host.mapped;
    for (i = 0; i < got; i++) ump_free(ptrs[i], S3_BLOCK);
    stats_now(&st);
    size_t rss1 = rss_now();
    size_t bound = S3_RETAIN + 64 * MiB + 8 * MiB;
    fprintf(stderr,
            "note: %zu blocks of 4096 B: host mapped %.1f MiB at the peak, %.1f MiB after the "
            "frees (bound %.0f MiB); cached %.1f MiB; RSS %.1f MiB before, %.1f MiB at the "
            "peak, %.1f MiB after\n",
            got, MB(mapped_peak), MB(st.host.mapped), MB(bound), MB(st.host.cached), MB(rss0),
            MB(rss_peak), MB(rss1));
    CHECK(got == S3_COUNT, "only %zu of %zu blocks allocated", got, S3_COUNT);
    CHECK(mapped_peak >= 2 * GiB, "host mapped %" PRIu64 " at the peak, want >= 2 GiB",
          mapped_peak);
    CHECK(st.host.mapped <= bound,
          "host mapped %.1f MiB after freeing 2 GiB, want <= %.0f MiB (retain 256 MiB + one "
          "64 MiB arena + 8 MiB)",
          MB(st.host.mapped), MB(bound));
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64 " after freeing everything",
          st.host.in_use);
    /* RSS: the retained chunks stay resident (their pages were touched); the rest must be
     * gone. The test's own usage (pointer table, sanitizer runtime) is in the baseline; 32 MiB
     * of slack covers what the runtime allocates meanwhile. */
    CHECK(rss1 <= rss0 + bound + 32 * MiB,
          "RSS %.1f MiB after the frees, baseline %.1f MiB: grew by %.1f MiB, want <= %.0f MiB",
          MB(rss1), MB(rss0), MB(rss1 - rss0), MB(bound + 32 * MiB));
    CHECK(rss_peak >= rss0 + 2 * GiB - 64 * MiB, "RSS grew only %.1f MiB at the peak (touching?)",
          MB(rss_peak - rss0));
    free(ptrs);
}

/* ---- 4. UMP_ALLOC_LIMIT: freed memory does not count against a new block ------------------- */

static void scenario_limit_after_free(void) {
    const size_t n = 400 * MiB / 4096;
    unsigned char **ptrs = (unsigned char **)malloc(n * sizeof *ptrs);
    CHECK(ptrs != NULL, "malloc of the pointer table failed");
    if (!ptrs) return;
    size_t i, got = 0;
    struct ump_stats st;
    for (i = 0; i < n; i++) {
        ptrs[i] = (unsigned char *)ump_malloc(4096);
        if (!ptrs[i]) {
            CHECK(0, "ump_malloc(4096) #%zu returned NULL: %s", i, last_err_or("-"));
            break;
        }
        ptrs[i][0] = 1;
        got++;
    }
    stats_now(&st);
    uint64_t mapped_full = st.host.mapped;
    for (i = 0; i < got; i++) ump_free(ptrs[i], 4096);
    free(ptrs);
    stats_now(&st);
    uint64_t mapped_before = st.host.mapped;
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64 " before the 200 MiB block",
          st.host.in_use);
    ump_clear_error();
    unsigned char *big = (unsigned char *)ump_malloc(200 * MiB);
    const char *err = ump_last_error();
    CHECK(big != NULL,
          "ump_malloc(200 MiB) under UMP_ALLOC_LIMIT=512M with nothing in use failed: %s",
          err ? err : "(no message)");
    stats_now(&st);
    fprintf(stderr,
            "note: %zu blocks of 4096 B: mapped %.1f MiB with all live, %.1f MiB after the frees "
            "(%s), %.1f MiB with the 200 MiB block\n",
            got, MB(mapped_full), MB(mapped_before),
            mapped_before + 200 * MiB > 512 * MiB ? "the 200 MiB block needs cached memory back"
                                                   : "the 200 MiB block fits beside the cache",
            MB(st.host.mapped));
    CHECK(st.host.mapped <= 512 * MiB, "host mapped %.1f MiB over the 512 MiB limit",
          MB(st.host.mapped));
    if (big) {
        big[0] = 1;
        big[200 * MiB - 1] = 2;
        ump_free(big, 200 * MiB);
    }
    stats_now(&st);
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64 " at the end", st.host.in_use);
}

/* ---- 5. ump_trim empties the cache of an idle thread ---------------------------------------- */

static pthread_mutex_t s5_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s5_cv = PTHREAD_COND_INITIALIZER;
static int s5_ready, s5_release;
static long s5_fail;

static void *s5_worker(void *arg) {
    (void)arg;
    uint64_t rng = 0x5151AA55DEADBEEFULL;
    unsigned char *live[100];
    int round, i;
    for (round = 0; round < 100; round++) {
        for (i = 0; i < 100; i++) {
            size_t n = 70000 + (size_t)(xorshift(&rng) % (250000 - 70000 + 1));
            live[i] = (unsigned char *)ump_malloc(n);
            if (!live[i]) {
                s5_fail++;
                continue;
            }
            live[i][0] = (unsigned char)i;
        }
        for (i = 99; i > 0; i--) { /* free in random order */
            int k = (int)(xorshift(&rng) % (uint64_t)(i + 1));
            unsigned char *t = live[i];
            live[i] = live[k];
            live[k] = t;
        }
        for (i = 0; i < 100; i++) ump_free(live[i], 0);
    }
    pthread_mutex_lock(&s5_mu);
    s5_ready = 1;
    pthread_cond_broadcast(&s5_cv);
    while (!s5_release) pthread_cond_wait(&s5_cv, &s5_mu); /* alive and idle */
    pthread_mutex_unlock(&s5_mu);
    return NULL;
}

static void scenario_idle_thread_cache(void) {
    pthread_t th;
    int rc = pthread_create(&th, NULL, s5_worker, NULL);
    CHECK(rc == 0, "pthread_create failed: %d", rc);
    if (rc != 0) return;
    pthread_mutex_lock(&s5_mu);
    while (!s5_ready) pthread_cond_wait(&s5_cv, &s5_mu);
    pthread_mutex_unlock(&s5_mu);

    struct ump_stats a, b;
    stats_now(&a);
    size_t trimmed = ump_trim();
    stats_now(&b);
    fprintf(stderr,
            "note: before ump_trim: host mapped %.2f MiB, cached %.2f MiB; ump_trim() = %zu "
            "(%.2f MiB); after: mapped %.2f MiB (%" PRIu64 " B), cached %" PRIu64 " B\n",
            MB(a.host.mapped), MB(a.host.cached), trimmed, MB(trimmed), MB(b.host.mapped),
            b.host.mapped, b.host.cached);
    CHECK(s5_fail == 0, "worker: %ld ump_malloc calls returned NULL", s5_fail);
    CHECK(a.host.cached > 0, "host cached is 0 after the worker freed everything");
    CHECK(a.host.mapped >= b.host.mapped && trimmed == a.host.mapped - b.host.mapped,
          "ump_trim() returned %zu but host mapped dropped by %" PRId64
          " (trim must report exactly what it unmapped)",
          trimmed, (int64_t)(a.host.mapped - b.host.mapped));
    /* Everything was freed and the main thread never allocated: nothing may stay. The worker's
     * blocks all fit one 64 MiB arena, so "<= 64 MiB" could not fail; an arena kept because
     * the idle worker's cached slots pin it shows as 64 MiB here. */
    CHECK(b.host.mapped < 64 * MiB,
          "host mapped %.2f MiB after ump_trim with an idle worker (its cache pins an arena?)",
          MB(b.host.mapped));
    CHECK(b.host.cached <= 64 * KiB,
          "host cached %" PRIu64 " B after ump_trim (the idle thread's cache was not emptied?)",
          b.host.cached);
    CHECK(b.host.in_use == 0, "host in_use %" PRIu64 " (all freed)", b.host.in_use);

    pthread_mutex_lock(&s5_mu);
    s5_release = 1;
    pthread_cond_broadcast(&s5_cv);
    pthread_mutex_unlock(&s5_mu);
    pthread_join(th, NULL);
    /* The worker's cache is usable again after the reclaim, and the pool still works. */
    void *p = ump_malloc(100000);
    CHECK(p != NULL, "ump_malloc after the trim failed: %s", last_err_or("-"));
    ump_free(p, 0);
}

/* ---- 6. retain bounds freed 8 MiB blocks; retain 0 gives back freed slabs -------------------- */

static void scenario_retain_8mib(void) {
    enum { N = 100 };
    unsigned char *p[N];
    int i, got = 0;
    struct ump_stats st;
    for (i = 0; i < N; i++) {
        p[i] = (unsigned char *)ump_malloc(8 * MiB);
        CHECK(p[i] != NULL, "ump_malloc(8 MiB) #%d returned NULL: %s", i, last_err_or("-"));
        if (p[i]) {
            p[i][0] = 1;
            got++;
        }
    }
    stats_now(&st);
    uint64_t peak = st.host.mapped;
    for (i = 0; i < N; i++) ump_free(p[i], 8 * MiB);
    stats_now(&st);
    fprintf(stderr,
            "note: %d blocks of 8 MiB: host mapped %.1f MiB with all live, %.1f MiB after the "
            "frees (retain 256 MiB), cached %.1f MiB\n",
            got, MB(peak), MB(st.host.mapped), MB(st.host.cached));
    CHECK(st.host.mapped <= 256 * MiB,
          "host mapped %.1f MiB after freeing 100 x 8 MiB, want <= 256 MiB (the default retain)",
          MB(st.host.mapped));
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64, st.host.in_use);
}

/* With UMP_ALLOC_HOST_RETAIN=0 every slab whose slots all come back goes back to the spans, and
 * every wholly free chunk to the OS. What may stay: this thread's cache (at most 64 slots of
 * the 1024-byte class, 64 KiB, bounded per class; about 2 MiB over all classes), but not the
 * slabs of those slots: with nothing live and the pool above its retain bound, slots cached
 * for slabs with no live block go back to them (issue 21; before, they pinned the 64 MiB
 * arena they were cut from, and this bound was 68 MiB). */
static void scenario_retain_zero(void) {
    const size_t n = 200000;
    unsigned char **p = (unsigned char **)malloc(n * sizeof *p);
    CHECK(p != NULL, "malloc of the pointer table failed");
    if (!p) return;
    size_t i, got = 0;
    struct ump_stats st;
    for (i = 0; i < n; i++) {
        p[i] = (unsigned char *)ump_malloc(1000);
        if (!p[i]) {
            CHECK(0, "ump_malloc(1000) #%zu returned NULL: %s", i, last_err_or("-"));
            break;
        }
        p[i][0] = 1;
        got++;
    }
    stats_now(&st);
    uint64_t peak = st.host.mapped;
    for (i = 0; i < got; i++) ump_free(p[i], 1000);
    stats_now(&st);
    fprintf(stderr,
            "note: %zu blocks of 1000 B: host mapped %.1f MiB with all live, %.2f MiB (%" PRIu64
            " B) after the frees (retain 0), cached %" PRIu64 " B\n",
            got, MB(peak), MB(st.host.mapped), st.host.mapped, st.host.cached);
    CHECK(st.host.mapped <= 4 * MiB,
          "host mapped %.2f MiB after freeing 200000 x 1000 B with UMP_ALLOC_HOST_RETAIN=0, "
          "want <= 4 MiB (cached slots must not pin their arena)",
          MB(st.host.mapped));
    CHECK(st.host.cached <= 2 * MiB + 64 * MiB, "host cached %" PRIu64 " B", st.host.cached);
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64, st.host.in_use);
    free(p);
    /* ump_trim gives back the rest: this thread's cache and the arena it pinned. */
    size_t t = ump_trim();
    stats_now(&st);
    fprintf(stderr, "note: then ump_trim() = %zu, host mapped %" PRIu64 " B\n", t,
            st.host.mapped);
    CHECK(st.host.mapped == 0, "host mapped %" PRIu64 " B after ump_trim with nothing in use",
          st.host.mapped);
}

/* ---- 7. no memory for a registry leaf -------------------------------------------------------- */

/* The registry maps a 512 KiB leaf for each 4 GiB of address space the first time a chunk lands
 * there. With RLIMIT_AS = current size + 64 MiB + 128 KiB + 64 KiB, the first chunk (a 64 MiB
 * arena, mapped as 64 MiB + 64 KiB and trimmed to 64 MiB for alignment) fits, and its leaf
 * (512 KiB + one page) does not. Not under ASan: its shadow needs a huge address space. */
static void scenario_registry_oom(void) {
    /* Everything that allocates lazily happens before the limit: initialisation, this thread's
     * error slot, stdio buffers. */
    CHECK(ump_init() == UMP_OK, "ump_init failed: %s", last_err_or("-"));
    struct ump_stats st;
    stats_now(&st);
    CHECK(st.host.mapped == 0, "host mapped %" PRIu64 " before the first allocation",
          st.host.mapped);
    ump_clear_error();
    (void)ump_last_error();
    fprintf(stderr, "note: registry-oom: setting RLIMIT_AS\n");
    fflush(stderr);

    struct rlimit old, lim;
    CHECK(getrlimit(RLIMIT_AS, &old) == 0, "getrlimit failed");
    size_t vs = 0;
    CHECK(statm(&vs, NULL) == 0, "reading /proc/self/statm failed");
    lim = old;
    lim.rlim_cur = (rlim_t)(vs + 64 * MiB + 128 * KiB + 64 * KiB);
    CHECK(setrlimit(RLIMIT_AS, &lim) == 0, "setrlimit failed: %s", strerror(errno));

    uint64_t e0 = ump_error_count();
    errno = 0;
    void *p = ump_malloc(1 * MiB);
    int err_no = errno;
    char msg[512];
    const char *e = ump_last_error();
    snprintf(msg, sizeof msg, "%s", e ? e : "(none)");
    uint64_t errs = ump_error_count() - e0;
    struct ump_stats st1;
    memset(&st1, 0, sizeof st1);
    st1.size = (uint32_t)sizeof st1;
    int src = ump_stats(&st1);
    size_t vs1 = 0;
    statm(&vs1, NULL);

    lim.rlim_cur = RLIM_INFINITY;
    if (lim.rlim_max != RLIM_INFINITY) lim.rlim_cur = old.rlim_cur;
    CHECK(setrlimit(RLIMIT_AS, &lim) == 0, "restoring RLIMIT_AS failed: %s", strerror(errno));

    fprintf(stderr,
            "note: virtual size %.3f MiB, RLIMIT_AS %.3f MiB (room %.3f MiB); ump_malloc(1 MiB) "
            "under it = %p, errno %d, %" PRIu64 " error(s): %s; host mapped then %" PRIu64
            ", virtual size %.3f MiB\n",
            MB(vs), MB(vs + 64 * MiB + 192 * KiB), MB(64 * MiB + 192 * KiB), p, err_no, errs, msg,
            st1.host.mapped, MB(vs1));
    CHECK(p == NULL,
          "ump_malloc(1 MiB) succeeded under RLIMIT_AS = size + 64 MiB + 192 KiB: the limit "
          "did not hit the registry leaf (tune the arithmetic)");
    if (p) ump_free(p, 0);
    CHECK(p != NULL || err_no == ENOMEM, "errno %d after the failed ump_malloc, want ENOMEM",
          err_no);
    CHECK(p != NULL || strstr(msg, "registry") != NULL,
          "ump_last_error() does not mention the registry: %s", msg);
    CHECK(p != NULL || errs >= 1, "the failure was not counted");
    CHECK(src == UMP_OK && st1.host.mapped == 0,
          "host mapped %" PRIu64 " after the failure (the chunk must be given back)",
          st1.host.mapped);
    CHECK(src == UMP_OK && st1.host.in_use == 0, "host in_use %" PRIu64 " after the failure",
          st1.host.in_use);

    /* Without the limit the allocator works as if nothing happened. */
    e0 = ump_error_count();
    unsigned char *q = (unsigned char *)ump_malloc(1 * MiB);
    CHECK(q != NULL, "ump_malloc(1 MiB) after raising the limit failed: %s", last_err_or("-"));
    if (q) {
        struct ump_identity id;
        fill_pattern(q, 1 * MiB, 7);
        CHECK(identify(q + 100, &id) == UMP_OK && id.ours && id.base == (size_t)(uintptr_t)q &&
                  id.block_size == 1 * MiB && id.kind == UMP_KIND_HOST,
              "ump_identify: ours %d base %#zx size %zu kind %d", id.ours, id.base,
              id.block_size, (int)id.kind);
        CHECK(check_pattern(q, 1 * MiB, 7) == SIZE_MAX, "the 1 MiB block does not read back");
        ump_free(q, 0);
        CHECK(identify(q, &id) == UMP_OK && !id.ours, "the freed block is still ours");
    }
    void *r = ump_malloc(3000), *s = ump_malloc(100 * MiB);
    CHECK(r != NULL && s != NULL, "further ump_malloc failed: %s", last_err_or("-"));
    ump_free(r, 0);
    ump_free(s, 0);
    CHECK(ump_error_count() == e0, "%" PRIu64 " errors after raising the limit: %s",
          ump_error_count() - e0, last_err_or("-"));
    stats_now(&st);
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64 " at the end", st.host.in_use);
}

/* ---- 8. small blocks get their natural alignment --------------------------------------------- */

static void scenario_small_alignment(void) {
    size_t A = ump_alignment();
    const char *env = getenv("UMP_ALLOC_ALIGNMENT");
    size_t want_a = (env && *env) ? (size_t)strtoull(env, NULL, 10) : 512;
    CHECK(A == want_a, "ump_alignment() = %zu, want %zu", A, want_a);
    static const struct {
        size_t n, want; /* want 0: the configured alignment */
    } rules[] = {{64, 64}, {8, 16}, {40, 16}, {512, 512}, {100000, 0}, {5000, 0}, {1, 16},
                 {16, 16}, {32, 32}, {128, 128}, {300000, 0}};
    size_t i;
    for (i = 0; i < sizeof rules / sizeof rules[0]; i++) {
        size_t want = rules[i].want ? rules[i].want : A;
        if (want > A) want = A;
        size_t got = ump_block_alignment(rules[i].n);
        CHECK(got == want, "ump_block_alignment(%zu) = %zu, want %zu (alignment %zu)", rules[i].n,
              got, want, A);
        void *p = ump_malloc(rules[i].n);
        CHECK(p != NULL && is_aligned(p, want), "ump_malloc(%zu) = %p not aligned to %zu",
              rules[i].n, p, want);
        ump_free(p, 0);
    }

    /* 100,000 blocks of 64 bytes: each aligned to 64, and packed in 64-byte slots: 6.1 MiB of
     * address range and of resident memory, where 512-byte slots would take 48.8 MiB. (Host
     * `mapped` counts whole 64 MiB arenas, so both layouts map one arena: it cannot tell them
     * apart; the extent of the blocks and the RSS growth can.) */
    enum { N = 100000 };
    unsigned char **p = (unsigned char **)malloc(N * sizeof *p);
    CHECK(p != NULL, "malloc of the pointer table failed");
    if (!p) return;
    memset(p, 0, N * sizeof *p);
    struct ump_stats st0, st;
    stats_now(&st0);
    size_t rss0 = rss_now();
    int misaligned = 0, got = 0;
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    for (i = 0; i < N; i++) {
        p[i] = (unsigned char *)ump_malloc(64);
        if (!p[i]) {
            CHECK(0, "ump_malloc(64) #%zu returned NULL: %s", i, last_err_or("-"));
            break;
        }
        got++;
        memset(p[i], (int)(i & 0xFF), 64);
        if (!is_aligned(p[i], 64) && misaligned++ < 5)
            CHECK(0, "ump_malloc(64) #%zu = %p not aligned to 64", i, (void *)p[i]);
        if ((uintptr_t)p[i] < lo) lo = (uintptr_t)p[i];
        if ((uintptr_t)p[i] + 64 > hi) hi = (uintptr_t)p[i] + 64;
    }
    stats_now(&st);
    size_t rss1 = rss_now();
    size_t extent = got ? (size_t)(hi - lo) : 0;
    fprintf(stderr,
            "note: alignment %zu: %d blocks of 64 B span %.2f MiB of addresses; RSS +%.2f MiB; "
            "host mapped %.1f MiB (was %.1f)\n",
            A, got, MB(extent), MB(rss1 > rss0 ? rss1 - rss0 : 0), MB(st.host.mapped),
            MB(st0.host.mapped));
    CHECK(misaligned == 0, "%d of %d 64-byte blocks not aligned to 64", misaligned, got);
    CHECK(extent <= 16 * MiB,
          "100000 blocks of 64 B span %.2f MiB of addresses, want <= 16 MiB (64-byte slots: "
          "6.1 MiB; 512-byte slots would be 48.8 MiB)",
          MB(extent));
    CHECK(rss1 <= rss0 + 16 * MiB, "RSS grew by %.2f MiB for 100000 x 64 B, want <= 16 MiB",
          MB(rss1 - rss0));
    CHECK(st.host.mapped <= 64 * MiB, "host mapped %.1f MiB for 6.1 MiB of small blocks",
          MB(st.host.mapped));
    for (i = 0; i < (size_t)got; i++) {
        if (p[i][0] != (unsigned char)(i & 0xFF) || p[i][63] != (unsigned char)(i & 0xFF)) {
            CHECK(0, "64-byte block #%zu %p was overwritten", i, (void *)p[i]);
            break;
        }
    }
    struct ump_identity id;
    if (got)
        CHECK(identify(p[0] + 63, &id) == UMP_OK && id.ours && id.block_size == 64 &&
                  id.base == (size_t)(uintptr_t)p[0],
              "ump_identify(64-byte block): ours %d size %zu", id.ours, id.block_size);
    for (i = 0; i < (size_t)got; i++) ump_free(p[i], 64);
    free(p);
    stats_now(&st);
    CHECK(st.host.in_use == 0, "host in_use %" PRIu64, st.host.in_use);
}

/* ---- 9. error messages, and silence on stderr -------------------------------------------------- */

#define S9_MSGS 8

static void scenario_messages(void) {
    char msgs[S9_MSGS][512];
    const char *what[S9_MSGS];
    uint64_t counted[S9_MSGS];
    int k = 0, i;
    struct ump_stats st0, st1;
    memset(msgs, 0, sizeof msgs);
    stats_now(&st0);

    /* stderr goes to a temporary file while the library runs. */
    fflush(stderr);
    FILE *tmp = tmpfile();
    CHECK(tmp != NULL, "tmpfile failed");
    if (!tmp) return;
    int saved = dup(2);
    int redirected = saved >= 0 && dup2(fileno(tmp), 2) >= 0;

#define KEEP(label)                                                            \
    do {                                                                       \
        const char *m_ = ump_last_error();                                     \
        snprintf(msgs[k], sizeof msgs[k], "%s", m_ ? m_ : "");                 \
        counted[k] = ump_error_count();                                        \
        what[k++] = (label);                                                   \
    } while (0)

    /* 0: double free of a small block. */
    unsigned char *a = (unsigned char *)ump_malloc(1000);
    ump_free(a, 0);
    ump_clear_error();
    ump_free(a, 0);
    KEEP("double free (1000 B)");
    /* 1: double free of a large block. */
    unsigned char *b = (unsigned char *)ump_malloc(3 * MiB);
    ump_free(b, 0);
    ump_clear_error();
    ump_free(b, 0);
    KEEP("double free (3 MiB)");
    /* 2: an interior pointer into a freed 2 MiB block. */
    unsigned char *c = (unsigned char *)ump_malloc(2 * MiB);
    ump_free(c, 0);
    ump_clear_error();
    ump_free(c + 4096, 0);
    KEEP("interior pointer into a freed 2 MiB block");
    /* 3: a foreign stack pointer. */
    int on_stack = 0;
    ump_clear_error();
    ump_free(&on_stack, 0);
    KEEP("stack pointer");
    /* 4: an interior pointer into a live small block. */
    unsigned char *d = (unsigned char *)ump_malloc(1000);
    ump_clear_error();
    ump_free(d + 16, 0);
    KEEP("interior pointer into a live 1000 B block");
    ump_free(d, 0);
    /* 5: an interior pointer into a live large block. */
    unsigned char *e = (unsigned char *)ump_malloc(2 * MiB);
    ump_clear_error();
    ump_free(e + 4096, 0);
    KEEP("interior pointer into a live 2 MiB block");
    ump_free(e, 0);
    /* 6: realloc of a freed block. */
    ump_clear_error();
    void *r = ump_realloc(a, 2000);
    KEEP("realloc of a freed block");
    /* 7: a foreign heap pointer (libc malloc). */
    void *h = malloc(64);
    ump_clear_error();
    ump_free(h, 0);
    KEEP("libc malloc pointer");
    free(h);
#undef KEEP

    fflush(stderr);
    if (redirected) dup2(saved, 2);
    if (saved >= 0) close(saved);
    long spilled = -1;
    char head[512] = "";
    if (fseek(tmp, 0, SEEK_END) == 0) spilled = ftell(tmp);
    if (spilled > 0) {
        rewind(tmp);
        size_t got = fread(head, 1, sizeof head - 1, tmp);
        head[got] = '\0';
    }
    fclose(tmp);
    stats_now(&st1);

    CHECK(redirected, "could not redirect stderr");
    CHECK(spilled == 0, "the library wrote %ld bytes to stderr: %s", spilled, head);
    CHECK(r == NULL, "ump_realloc of a freed block returned %p", r);
    for (i = 0; i < k; i++) {
        fprintf(stderr, "note: %-44s -> %s\n", what[i], msgs[i]);
        CHECK(msgs[i][0] != '\0', "%s: no ump_last_error() message", what[i]);
        CHECK(strstr(msgs[i], "internal error") == NULL, "%s: an internal error: %s", what[i],
              msgs[i]);
        CHECK(strstr(msgs[i], "internal error: internal error") == NULL,
              "%s: doubled \"internal error\": %s", what[i], msgs[i]);
        /* The entry point names itself once. */
        const char *colon = strchr(msgs[i], ':');
        if (colon && colon > msgs[i]) {
            char name[64];
            size_t len = (size_t)(colon - msgs[i]);
            if (len < sizeof name) {
                memcpy(name, msgs[i], len);
                name[len] = ':';
                name[len + 1] = '\0';
                CHECK(strstr(colon + 1, name) == NULL, "%s: the prefix \"%s\" repeats: %s",
                      what[i], name, msgs[i]);
            }
        }
        CHECK(counted[i] == (i ? counted[i - 1] : st0.errors) + 1,
              "%s: counted %" PRIu64 " errors, want 1", what[i],
              counted[i] - (i ? counted[i - 1] : st0.errors));
    }
    CHECK(strstr(msgs[0], "ump_free") && strstr(msgs[0], "double free"),
          "double free (small): %s", msgs[0]);
    CHECK(strstr(msgs[1], "ump_free") && strstr(msgs[1], "double free"),
          "double free (large): %s", msgs[1]);
    CHECK(strstr(msgs[2], "double free") == NULL,
          "an interior pointer into a freed block is not a double free: %s", msgs[2]);
    CHECK(strstr(msgs[2], "not at the start") != NULL || strstr(msgs[2], "inside") != NULL,
          "interior pointer into a freed block: the message should say it is not a block "
          "start: %s",
          msgs[2]);
    CHECK(strstr(msgs[3], "not allocated by ump-alloc") != NULL, "stack pointer: %s", msgs[3]);
    CHECK(strstr(msgs[3], "double free") == NULL, "stack pointer is not a double free: %s",
          msgs[3]);
    CHECK(strstr(msgs[4], "not at its start") != NULL || strstr(msgs[4], "inside") != NULL,
          "interior pointer into a live block: %s", msgs[4]);
    CHECK(strstr(msgs[5], "inside") != NULL, "interior pointer into a live 2 MiB block: %s",
          msgs[5]);
    CHECK(strstr(msgs[6], "ump_realloc") != NULL, "realloc of a freed block: %s", msgs[6]);
    CHECK(strstr(msgs[7], "not allocated by ump-alloc") != NULL, "libc pointer: %s", msgs[7]);
    CHECK(st1.errors_double_free - st0.errors_double_free == 3,
          "double frees counted: %" PRIu64 ", want 3 (two double frees and the realloc)",
          st1.errors_double_free - st0.errors_double_free);

    /* Not a check: an interior pointer at a 64 KiB boundary of a freed 2 MiB block. */
    unsigned char *f = (unsigned char *)ump_malloc(2 * MiB);
    ump_free(f, 0);
    ump_clear_error();
    ump_free(f + 65536, 0);
    fprintf(stderr, "note: %-44s -> %s\n", "(info) freed 2 MiB block + 64 KiB",
            last_err_or("(none)"));
}

/* ---- main ------------------------------------------------------------------------------------- */

static const struct scenario scenarios[] = {
    {"stale-free-vs-trim", scenario_stale_free_vs_trim},
    {"fork-churn", scenario_fork_churn},
    {"burst-retain", scenario_burst_retain},
    {"limit-after-free", scenario_limit_after_free},
    {"idle-thread-cache", scenario_idle_thread_cache},
    {"retain-8mib", scenario_retain_8mib},
    {"retain-zero", scenario_retain_zero},
    {"registry-oom", scenario_registry_oom},
    {"small-alignment", scenario_small_alignment},
    {"messages", scenario_messages},
};

int main(int argc, char **argv) {
    return run_scenario("reliability", scenarios, sizeof scenarios / sizeof scenarios[0], argc,
                        argv);
}
