/* fork() torture over the pinned, shared host side (run over tests/fork/standin_cuda.c).
 *
 * What it checks: the rule of README "fork(): what a child gets": memory the parent frees
 * never changes under a fork child; a block live at a fork is not reused while a child of that
 * fork (or a fork child of that child) lives. With UMP_ALLOC_PINNED_FORK=share (the default)
 * a child maps the parent's pinned chunks MAP_PRIVATE from the parent's memory file, so it sees
 * the parent's later writes to every page it has not written: a block the parent frees and
 * reuses while a child lives shows the new owner's data in the child. ump-alloc holds such
 * blocks back (src/pool/hold.rs) and tracks children with OFD locks (src/backing/shared.rs).
 *
 * How: 8 threads churn ump_malloc / ump_calloc / ump_realloc / ump_free of small (16 B -
 * 64 KiB) and large (1 - 32 MiB) blocks, with an ump_trim or ump_stats now and then (both give
 * held blocks back at once). Every live block is stamped from its own seed: word i = seed ^
 * (i * GOLDEN), every word of a small block, every 64th (one per 512 bytes: every page) and the
 * last of a large one, and kept in its thread's table (one mutex per table; a block is stamped
 * before it enters a table and leaves the table before it is freed or reallocated). A realloc
 * that moves the block gives it a new seed and stamps it again; one that keeps it in place
 * keeps its seed and is stamped again with it (the pattern depends only on the seed and the
 * index, so its words keep their values: in place, the block is the same array, whose in-place
 * writes a child may see by the documented rule; --realloc-new-seed shows that). The main
 * thread forks 300 times with every table mutex held, so that each child inherits tables of
 * blocks that were all live and stamped at the fork. Each child (and, for every 10th fork, a
 * grandchild it forks at once) re-reads every block of the tables for 10 ms (at least 2
 * passes; a grandchild twice as long, so that it often outlives its parent and is reaped here,
 * the subreaper), counts the words that differ, reports through a pipe and _exits 0 (clean) or
 * 3 (corrupted); it makes no ump_* call. Up to 4 children live at once (held blocks matter
 * only while children live), and every 10th fork waits for all of them first: blocks held for
 * overlapping children go back only once none lives, so without these pauses what is held
 * grows with the run (gigabytes). The churn threads run at nice 5, so that the children (nice
 * 0) get the CPU on a small machine.
 *
 * Exit 1 if any child or grandchild saw corruption, crashed, was killed or sent no report, or
 * an allocation failed; 2 if ump_malloc's memory is not pinned (the test would test nothing:
 * run it over the stand-in libcuda.so.1); a 120 s alarm fails a hang. Expected: 0 corrupted
 * children, with UMP_ALLOC_PINNED_FORK=share (the default) and with copy (the control).
 *
 * Options (defaults above): --forks N, --threads N, --outstanding N, --child-ms N,
 * --drain-every N (0: never), --large-every N (1 in N allocations is large), --large-live N
 * (large blocks live per thread), --nice N, --seed N, --realloc-new-seed. */
#define _GNU_SOURCE
#include "common.h"
#include "ump_alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
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

#define KiB ((size_t)1 << 10)
#define GOLDEN UINT64_C(0x9E3779B97F4A7C15)
#define SMALL_MAX (64 * KiB)
#define LARGE_MIN (1 * MiB)
#define LARGE_MAX (32 * MiB)
#define LARGE_STRIDE 64 /* words: one per 512 bytes */
#define MAX_THREADS 32
#define SLOTS 64        /* live blocks per thread */
#define MAX_OUTSTANDING 64

/* ---- settings ------------------------------------------------------------------------------- */

static int g_forks = 300, g_threads = 8, g_outstanding = 4, g_child_ms = 10, g_drain_every = 10,
           g_large_every = 32, g_large_live = 1, g_nice = 5, g_held_cap_mib = 512;
static uint64_t g_seed = 1;
static bool g_realloc_new_seed;

/* ---- helpers -------------------------------------------------------------------------------- */

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Log-uniform in [lo, hi]. */
static size_t log_uniform(uint64_t *rng, size_t lo, size_t hi) {
    int lb = 63 - __builtin_clzll(lo), hb = 63 - __builtin_clzll(hi);
    int b = lb + (int)(xorshift(rng) % (uint64_t)(hb - lb + 1));
    size_t base = (size_t)1 << b;
    size_t n = base + (size_t)(xorshift(rng) % base);
    return n < lo ? lo : n > hi ? hi : n;
}

/* ---- blocks and their stamps ---------------------------------------------------------------- */

struct block {
    uint64_t *p;
    size_t n; /* bytes */
    uint64_t seed;
};

struct table {
    pthread_mutex_t mu;
    int live, large;
    struct block b[SLOTS];
} __attribute__((aligned(64)));

static struct table g_tables[MAX_THREADS];

static size_t words_of(size_t n) { return n / 8; }
static size_t stride_of(size_t n) { return n > SMALL_MAX ? LARGE_STRIDE : 1; }
static uint64_t word_value(uint64_t seed, size_t i) { return seed ^ ((uint64_t)i * GOLDEN); }

static void stamp(const struct block *b) {
    size_t w = words_of(b->n), s = stride_of(b->n);
    for (size_t i = 0; i < w; i += s) b->p[i] = word_value(b->seed, i);
    b->p[w - 1] = word_value(b->seed, w - 1);
}

/* Words of `b` that differ from its stamp; adds the words read to *reads. */
static long check(const struct block *b, long *reads) {
    size_t w = words_of(b->n), s = stride_of(b->n);
    const volatile uint64_t *p = b->p;
    long bad = 0, r = 0;
    for (size_t i = 0; i < w; i += s, r++) bad += p[i] != word_value(b->seed, i);
    bad += p[w - 1] != word_value(b->seed, w - 1);
    *reads += r + 1;
    return bad;
}

/* ---- the churn threads ---------------------------------------------------------------------- */

static atomic_int g_stop;
static atomic_long g_ops, g_allocs, g_null, g_calloc_dirty, g_trims, g_stats_calls;
static atomic_ullong g_held_peak, g_held_blocks_peak;
static atomic_long g_held_wrapped;

/* Read the statistics (which give back the held blocks no child may read any more) and note
 * the peak of what is held back for fork children. Returns the bytes held now. */
static uint64_t note_held(void) {
    struct ump_stats st;
    memset(&st, 0, sizeof st);
    st.size = (uint32_t)sizeof st;
    if (ump_stats(&st) != UMP_OK) return 0;
    if (st.host_fork_held_blocks > (UINT64_C(1) << 62) || st.host_fork_held > (UINT64_C(1) << 62)) {
        /* A counter read while below zero: a block given back before it was counted as held
         * (fixed in pool::hold: counted under its class lock). A failure, told at the end. */
        atomic_fetch_add(&g_held_wrapped, 1);
        return 0;
    }
    unsigned long long cur = atomic_load(&g_held_peak);
    while (st.host_fork_held > cur && !atomic_compare_exchange_weak(&g_held_peak, &cur,
                                                                       st.host_fork_held)) {
    }
    cur = atomic_load(&g_held_blocks_peak);
    while (st.host_fork_held_blocks > cur &&
           !atomic_compare_exchange_weak(&g_held_blocks_peak, &cur, st.host_fork_held_blocks)) {
    }
    return st.host_fork_held;
}

static size_t pick_size(uint64_t *rng, bool large) {
    return large ? log_uniform(rng, LARGE_MIN, LARGE_MAX) : log_uniform(rng, 16, SMALL_MAX);
}

static void *churn(void *arg) {
    int t = (int)(intptr_t)arg;
    struct table *tb = &g_tables[t];
    uint64_t rng = (g_seed + (uint64_t)t + 1) * GOLDEN;
    if (g_nice) setpriority(PRIO_PROCESS, (id_t)gettid(), g_nice);
    while (!atomic_load(&g_stop)) {
        uint64_t r = xorshift(&rng);
        int live = tb->live; /* only this thread changes it */
        if ((r & 0xFFF) == 0) {
            ump_trim();
            atomic_fetch_add(&g_trims, 1);
        } else if ((r & 0xFFF) == 1) {
            note_held();
            atomic_fetch_add(&g_stats_calls, 1);
        } else if (live < SLOTS && (live == 0 || (r >> 12) % 100 < 52)) {
            bool large = tb->large < g_large_live && (r >> 20) % (uint64_t)g_large_every == 0;
            struct block b = {NULL, pick_size(&rng, large), xorshift(&rng)};
            bool zeroed = (r >> 24) % 4 == 0;
            b.p = zeroed ? (uint64_t *)ump_calloc(1, b.n) : (uint64_t *)ump_malloc(b.n);
            if (!b.p) {
                atomic_fetch_add(&g_null, 1);
                continue;
            }
            atomic_fetch_add(&g_allocs, 1);
            if (zeroed) {
                size_t w = words_of(b.n), s = stride_of(b.n);
                for (size_t i = 0; i < w; i += s)
                    if (b.p[i] != 0) {
                        atomic_fetch_add(&g_calloc_dirty, 1);
                        break;
                    }
            }
            stamp(&b);
            pthread_mutex_lock(&tb->mu);
            tb->b[tb->live++] = b;
            tb->large += b.n > SMALL_MAX;
            pthread_mutex_unlock(&tb->mu);
        } else if (live > 0) {
            int k = (int)((r >> 48) % (uint64_t)live);
            pthread_mutex_lock(&tb->mu);
            struct block b = tb->b[k];
            tb->b[k] = tb->b[--tb->live];
            tb->large -= b.n > SMALL_MAX;
            pthread_mutex_unlock(&tb->mu);
            if ((r >> 40) % 3 != 0) {
                ump_free(b.p, b.n);
                atomic_fetch_add(&g_ops, 1);
                continue;
            }
            /* realloc: mostly within the block's range of sizes, now and then across it (to
             * large as often as an allocation is large) */
            bool large = b.n > SMALL_MAX;
            if (large)
                large = (r >> 44) % 8 != 0;
            else
                large = tb->large < g_large_live && (r >> 44) % (uint64_t)g_large_every == 0;
            size_t n = pick_size(&rng, large);
            uint64_t *q = (uint64_t *)ump_realloc(b.p, n);
            if (!q) {
                atomic_fetch_add(&g_null, 1);
                ump_free(b.p, b.n);
                continue;
            }
            atomic_fetch_add(&g_allocs, 1);
            if (q != b.p || g_realloc_new_seed) b.seed = xorshift(&rng);
            b.p = q;
            b.n = n;
            stamp(&b);
            pthread_mutex_lock(&tb->mu);
            tb->b[tb->live++] = b;
            tb->large += b.n > SMALL_MAX;
            pthread_mutex_unlock(&tb->mu);
        }
        atomic_fetch_add(&g_ops, 1);
    }
    pthread_mutex_lock(&tb->mu);
    while (tb->live > 0) {
        struct block b = tb->b[--tb->live];
        ump_free(b.p, b.n);
    }
    tb->large = 0;
    pthread_mutex_unlock(&tb->mu);
    return NULL;
}

/* ---- children ------------------------------------------------------------------------------- */

enum { KIND_CHILD = 1, KIND_GRANDCHILD = 2 };

/* What a child or grandchild reports (one write, atomic on a pipe). */
struct report {
    int32_t kind, pid;
    int64_t reads, bad, passes, blocks, bad_small, bad_large, us;
};

static int g_report_fd = -1;

/* Re-read every block of the inherited tables for `ms` milliseconds (at least 2 passes),
 * report, _exit. No lock is taken (this process has one thread) and no ump_* call is made. */
static void verify_and_exit(int kind, int ms) {
    struct report rep;
    memset(&rep, 0, sizeof rep);
    rep.kind = kind;
    rep.pid = (int32_t)getpid();
    static bool seen_bad[MAX_THREADS][SLOTS];
    double start = now_s(), end = start + ms / 1000.0;
    do {
        long reads = 0, bad = 0, blocks = 0;
        for (int t = 0; t < g_threads; t++)
            for (int k = 0; k < g_tables[t].live; k++, blocks++) {
                long b = check(&g_tables[t].b[k], &reads);
                if (b && !seen_bad[t][k]) {
                    seen_bad[t][k] = true;
                    if (g_tables[t].b[k].n > SMALL_MAX)
                        rep.bad_large++;
                    else
                        rep.bad_small++;
                }
                bad += b;
            }
        rep.reads += reads;
        rep.bad += bad;
        rep.blocks = blocks;
        rep.passes++;
    } while (rep.passes < 2 || now_s() < end);
    rep.us = (int64_t)((now_s() - start) * 1e6);
    ssize_t w = write(g_report_fd, &rep, sizeof rep);
    (void)w;
    _exit(rep.bad ? 3 : 0);
}

static void child_main(int f) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (f % 10 == 0) {
        pid_t g = fork();
        if (g == 0) verify_and_exit(KIND_GRANDCHILD, 2 * g_child_ms);
        /* g < 0: no grandchild this time; the parent counts the reports it gets. */
    }
    /* No wait for the grandchild: it outlives this child, and the main process (the
     * subreaper) reaps it. */
    verify_and_exit(KIND_CHILD, g_child_ms);
}

/* ---- the main process ----------------------------------------------------------------------- */

static pid_t g_kids[MAX_OUTSTANDING];
static int g_nkids;
static long g_reaped, g_reaped_other, g_crashed, g_corrupt_exits;
static long g_children_reported, g_grandchildren_reported, g_bad_children, g_bad_grandchildren;
static long long g_reads, g_bad_reads, g_bad_small, g_bad_large;
static long long g_child_us;

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "torture: FAIL: watchdog (alarm) fired: a hang\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    for (int i = 0; i < g_nkids; i++) kill(g_kids[i], SIGKILL);
    _exit(4);
}

static int g_read_fd = -1;

static void read_reports(void) {
    struct report rep;
    ssize_t got;
    while ((got = read(g_read_fd, &rep, sizeof rep)) == (ssize_t)sizeof rep) {
        g_reads += rep.reads;
        g_bad_reads += rep.bad;
        g_bad_small += rep.bad_small;
        g_bad_large += rep.bad_large;
        g_child_us += rep.us;
        if (rep.kind == KIND_CHILD) {
            g_children_reported++;
            g_bad_children += rep.bad != 0;
        } else {
            g_grandchildren_reported++;
            g_bad_grandchildren += rep.bad != 0;
        }
        if (rep.bad && g_bad_children + g_bad_grandchildren <= 5)
            fprintf(stderr, "torture: %s %d: %" PRId64 " of %" PRId64 " words read differed, in %"
                    PRId64 " small and %" PRId64 " large of %" PRId64 " blocks (%" PRId64
                    " passes)\n",
                    rep.kind == KIND_CHILD ? "child" : "grandchild", rep.pid, rep.bad, rep.reads,
                    rep.bad_small, rep.bad_large, rep.blocks, rep.passes);
    }
}

/* Reap what has exited (all of it with `block`), counting direct children out. */
static void reap(bool block) {
    for (;;) {
        int st = 0;
        pid_t p = waitpid(-1, &st, block ? 0 : WNOHANG);
        if (p <= 0) break;
        g_reaped++;
        int i = 0;
        while (i < g_nkids && g_kids[i] != p) i++;
        if (i < g_nkids)
            g_kids[i] = g_kids[--g_nkids];
        else
            g_reaped_other++;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3) {
            g_corrupt_exits++;
        } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            if (g_crashed++ < 5)
                fprintf(stderr, "torture: process %d %s %d\n", (int)p,
                        WIFSIGNALED(st) ? "killed by signal" : "exited with",
                        WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
        }
        if (!block) continue;
        if (g_nkids < g_outstanding) break;
    }
    read_reports();
}

static int usage(void) {
    fprintf(stderr, "usage: torture [--forks N] [--threads N] [--outstanding N] [--child-ms N] "
                    "[--drain-every N] [--held-cap-mib N] [--large-every N] [--large-live N] "
                    "[--nice N] [--seed N] [--realloc-new-seed]\n");
    return 2;
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has = i + 1 < argc;
        if (strcmp(a, "--forks") == 0 && has)
            g_forks = atoi(argv[++i]);
        else if (strcmp(a, "--threads") == 0 && has)
            g_threads = atoi(argv[++i]);
        else if (strcmp(a, "--outstanding") == 0 && has)
            g_outstanding = atoi(argv[++i]);
        else if (strcmp(a, "--child-ms") == 0 && has)
            g_child_ms = atoi(argv[++i]);
        else if (strcmp(a, "--nice") == 0 && has)
            g_nice = atoi(argv[++i]);
        else if (strcmp(a, "--large-live") == 0 && has)
            g_large_live = atoi(argv[++i]);
        else if (strcmp(a, "--large-every") == 0 && has)
            g_large_every = atoi(argv[++i]);
        else if (strcmp(a, "--held-cap-mib") == 0 && has)
            g_held_cap_mib = atoi(argv[++i]);
        else if (strcmp(a, "--drain-every") == 0 && has)
            g_drain_every = atoi(argv[++i]);
        else if (strcmp(a, "--seed") == 0 && has)
            g_seed = strtoull(argv[++i], NULL, 10);
        else if (strcmp(a, "--realloc-new-seed") == 0)
            g_realloc_new_seed = true;
        else
            return usage();
    }
    if (g_threads < 1 || g_threads > MAX_THREADS || g_outstanding < 1 ||
        g_outstanding > MAX_OUTSTANDING || g_forks < 0 || g_child_ms < 0 || g_large_every < 1)
        return usage();

    signal(SIGALRM, on_alarm);
    alarm(120);
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    int fds[2];
    if (pipe(fds) != 0) {
        perror("torture: pipe");
        return 1;
    }
    g_read_fd = fds[0];
    g_report_fd = fds[1];
    fcntl(g_read_fd, F_SETFL, fcntl(g_read_fd, F_GETFL) | O_NONBLOCK);

    /* The test tests something only where ump_malloc gives pinned (registered) memory. */
    struct ump_capabilities caps;
    memset(&caps, 0, sizeof caps);
    caps.size = (uint32_t)sizeof caps;
    void *s = ump_malloc(100), *l = ump_malloc(4 * MiB);
    struct ump_identity is, il;
    memset(&is, 0, sizeof is);
    memset(&il, 0, sizeof il);
    is.size = il.size = (uint32_t)sizeof is;
    if (!s || !l || ump_capabilities(&caps) != UMP_OK || ump_identify(s, &is) != UMP_OK ||
        ump_identify(l, &il) != UMP_OK || is.kind != UMP_KIND_REGISTERED ||
        il.kind != UMP_KIND_REGISTERED) {
        fprintf(stderr,
                "torture: FAIL: ump_malloc does not give pinned memory here (kinds %d, %d; host "
                "side %d: %s): the test would test nothing. Run it over the stand-in "
                "libcuda.so.1 (LD_LIBRARY_PATH).\n",
                (int)is.kind, (int)il.kind, (int)caps.host_side, caps.host_reason);
        return 2;
    }
    ump_free(s, 100);
    ump_free(l, 4 * MiB);
    const char *rule = caps.fork_shared ? "share" : "copy";

    double t0 = now_s();
    pthread_t th[MAX_THREADS];
    for (int t = 0; t < g_threads; t++) {
        pthread_mutex_init(&g_tables[t].mu, NULL);
        if (pthread_create(&th[t], NULL, churn, (void *)(intptr_t)t) != 0) {
            fprintf(stderr, "torture: pthread_create failed\n");
            return 1;
        }
    }
    while (atomic_load(&g_ops) < 2000) sleep_us(200);

    uint64_t rng = (g_seed + 1000) * GOLDEN;
    long forks = 0, fork_fails = 0, grand_forks = 0;
    double fork_s = 0, fork_max_s = 0;
    long held_drains = 0;
    for (int f = 0; f < g_forks; f++) {
        if (g_nkids >= g_outstanding) reap(true);
        bool drain = g_drain_every > 0 && f > 0 && f % g_drain_every == 0;
        if (!drain && g_held_cap_mib > 0 && note_held() > (uint64_t)g_held_cap_mib * MiB) {
            drain = true;
            held_drains++;
        }
        if (drain)
            while (g_nkids > 0) reap(true);
        reap(false);
        sleep_us((long)(xorshift(&rng) % 2000)); /* let the threads churn between forks */
        for (int t = 0; t < g_threads; t++) pthread_mutex_lock(&g_tables[t].mu);
        double tf = now_s();
        pid_t pid = fork();
        tf = now_s() - tf;
        fork_s += tf;
        if (tf > fork_max_s) fork_max_s = tf;
        if (pid == 0) child_main(f);
        for (int t = 0; t < g_threads; t++) pthread_mutex_unlock(&g_tables[t].mu);
        if (pid < 0) {
            fork_fails++;
            continue;
        }
        forks++;
        grand_forks += f % 10 == 0;
        g_kids[g_nkids++] = pid;
    }
    while (g_nkids > 0) reap(true);
    atomic_store(&g_stop, 1);
    for (int t = 0; t < g_threads; t++) pthread_join(th[t], NULL);
    /* Grandchildren left (orphans now ours, the subreaper's). */
    for (;;) {
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p <= 0) break;
        g_reaped++;
        g_reaped_other++;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 3)
            g_corrupt_exits++;
        else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            g_crashed++;
    }
    read_reports();
    note_held();
    alarm(0);
    double took = now_s() - t0;

    long lost = forks + grand_forks - g_children_reported - g_grandchildren_reported;
    printf("torture (%s): forks %ld, children %ld, grandchildren %ld, reads checked %lld, "
           "corrupted children %ld (grandchildren %ld), corrupted reads %lld (blocks: %lld "
           "small, %lld large), crashed %ld, parent allocations %ld (%ld NULL, %ld calloc not "
           "zero), churn ops %ld, trims %ld, fork_held peak %.1f MiB / %llu blocks, children's "
           "mean life %.1f ms, fork() mean %.2f ms max %.1f ms, %ld waits for held memory, "
           "%.1f s\n",
           rule, forks, g_children_reported, g_grandchildren_reported, g_reads, g_bad_children,
           g_bad_grandchildren, g_bad_reads, g_bad_small, g_bad_large, g_crashed,
           atomic_load(&g_allocs),
           atomic_load(&g_null), atomic_load(&g_calloc_dirty), atomic_load(&g_ops),
           atomic_load(&g_trims), (double)atomic_load(&g_held_peak) / (double)MiB,
           atomic_load(&g_held_blocks_peak),
           g_children_reported + g_grandchildren_reported
               ? (double)g_child_us / 1e3 / (double)(g_children_reported + g_grandchildren_reported)
               : 0.0,
           forks ? fork_s * 1e3 / (double)forks : 0.0, fork_max_s * 1e3, held_drains, took);
    bool fail = g_bad_children || g_bad_grandchildren || g_crashed || g_corrupt_exits || lost ||
                fork_fails || atomic_load(&g_null) || atomic_load(&g_calloc_dirty) ||
                atomic_load(&g_held_wrapped);
    if (lost) fprintf(stderr, "torture: %ld children or grandchildren sent no report\n", lost);
    if (fork_fails) fprintf(stderr, "torture: %ld forks failed\n", fork_fails);
    if (atomic_load(&g_held_wrapped))
        fprintf(stderr, "torture: FAIL: ump_stats read host_fork_held(_blocks) below zero "
                        "(wrapped) %ld times: a held block given back before it was counted\n",
                atomic_load(&g_held_wrapped));
    return fail ? 1 : 0;
}
