/* Regression tests of the second review of the allocator core (issue 21), through the public C
 * API only. Each scenario runs as its own process (see run.sh next to this file):
 *
 *   test_review refused-growth        a refused ump_realloc leaves no mapping, no address space
 *                                      and no registry leaf behind, and swallows no free memory
 *                                      (plain build: it ends under an address-space limit)
 *   test_review refused-growth-limit  the same under UMP_ALLOC_LIMIT=96M: the arena's free
 *                                      memory stays free and serves the next ump_malloc
 *   test_review cache-retain          with nothing live, a long-lived thread keeps about
 *                                      UMP_ALLOC_HOST_RETAIN mapped (its cached slots pin no arena)
 *   test_review scope-realloc         scopes follow every size change of a block, in place too
 *   test_review realloc-counts        a small realloc in place keeps the books exact
 *   test_review stream-retire-device  ump_stream_retire refuses a device that does not exist
 *
 * Expects a machine without a usable GPU (mode "host"). Prints FAIL lines on stderr and one
 * summary line "review <scenario>: N passed, M failed"; exits non-zero if M > 0.
 */

#define _GNU_SOURCE

#include "harness.h"

#include <limits.h>

/* Lines of /proc/self/maps: the process's mappings (the registry maps a 512 KiB leaf per 4 GiB
 * of address space it covers, one mapping each). Read into a stack buffer, no heap use. */
static size_t map_count(void) {
    char buf[65536];
    size_t lines = 0;
    ssize_t n;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        ssize_t i;
        for (i = 0; i < n; i++) lines += buf[i] == '\n';
    }
    close(fd);
    return lines;
}

static size_t vsize_now(void) {
    size_t v = 0;
    statm(&v, NULL);
    return v;
}

/* What a refusal must leave as it was. */
struct book {
    size_t maps, vsize;
    struct ump_stats st;
};

static void book_now(struct book *b) {
    stats_now(&b->st);
    b->maps = map_count();
    b->vsize = vsize_now();
}

/* A refused call changed nothing: the same mappings (16 of slack for the C runtime's and the
 * sanitizer's own: the defect left 32,769), the same address space (4 MiB slack), and the host
 * side's books. */
static void same_book(const char *what, const struct book *a, const struct book *b) {
    CHECK(b->maps <= a->maps + 16, "%s: %zu mappings after the refusal, %zu before", what,
          b->maps, a->maps);
    CHECK(b->vsize <= a->vsize + 4 * MiB,
          "%s: address space grew by %.1f MiB over the refusal (%.1f -> %.1f MiB)", what,
          MB(b->vsize - a->vsize), MB(a->vsize), MB(b->vsize));
    CHECK(b->st.host.mapped == a->st.host.mapped,
          "%s: host mapped %" PRIu64 " -> %" PRIu64, what, a->st.host.mapped, b->st.host.mapped);
    CHECK(b->st.host_reserved == a->st.host_reserved,
          "%s: host reserved %" PRIu64 " -> %" PRIu64, what, a->st.host_reserved,
          b->st.host_reserved);
    CHECK(b->st.host.cached == a->st.host.cached,
          "%s: host cached %" PRIu64 " -> %" PRIu64 " (free memory taken into the block?)", what,
          a->st.host.cached, b->st.host.cached);
    CHECK(b->st.host_largest_free == a->st.host_largest_free,
          "%s: host largest_free %" PRIu64 " -> %" PRIu64, what, a->st.host_largest_free,
          b->st.host_largest_free);
    CHECK(b->st.host.in_use == a->st.host.in_use,
          "%s: host in_use %" PRIu64 " -> %" PRIu64, what, a->st.host.in_use, b->st.host.in_use);
}

/* The block at p is live, n bytes, seeded with `seed`, and nothing past it is a live block. */
static void block_intact(const char *what, unsigned char *p, size_t n, uint64_t seed) {
    struct ump_identity id;
    CHECK(identify(p, &id) == UMP_OK && id.ours && id.base == (size_t)(uintptr_t)p &&
              id.block_size == n,
          "%s: ump_identify(block) ours %d base %#zx size %zu, want %p and %zu", what, id.ours,
          id.base, id.block_size, (void *)p, n);
    size_t bad = check_pattern(p, n, seed);
    CHECK(bad == SIZE_MAX, "%s: byte %zu of the block changed", what, bad);
}

/* A refused realloc of the block at p (n bytes) to `to`: NULL, errno ENOMEM, the block intact,
 * and the books unchanged. */
static void refuse(const char *what, unsigned char *p, size_t n, uint64_t seed, size_t to) {
    struct book a, b;
    book_now(&a);
    errno = 0;
    void *r = ump_realloc(p, to);
    int err = errno;
    book_now(&b);
    fprintf(stderr, "note: %s: ump_realloc -> %p (%s), %zu -> %zu mappings, %+.1f MiB address "
            "space\n", what, r, last_err_or("-"), a.maps, b.maps,
            ((double)b.vsize - (double)a.vsize) / (double)MiB);
    CHECK(r == NULL, "%s: ump_realloc(%zu -> %zu) = %p, want NULL", what, n, to, r);
    if (r != NULL) return;
    CHECK(err == ENOMEM, "%s: errno %d, want ENOMEM", what, err);
    block_intact(what, p, n, seed);
    same_book(what, &a, &b);
}

/* ---- 1. refused growth, no limit ------------------------------------------------------------ */

/* vm.overcommit_memory: under 1 ("always") the OS grants any size that fits the address space,
 * so only sizes past the user address space (128 TiB) are sure to be refused. */
static int overcommit_always(void) {
    char c = '0';
    int fd = open("/proc/sys/vm/overcommit_memory", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &c, 1) != 1) c = '0';
        close(fd);
    }
    return c == '1';
}

static void scenario_refused_growth(void) {
    /* A block with a chunk of its own (40 MiB), grown to 64 TiB (the case), 16 TiB and
     * past the address space: the OS refuses both growing the mapping and a new one. Nothing
     * may stay: no registry leaf for the range the OS did not grant (32,768 of them were made
     * for 64 TiB), no address space. */
    static const struct {
        size_t n;
        const char *what;
    } huge[] = {{(size_t)1 << 46, "64 TiB"}, {(size_t)1 << 44, "16 TiB"},
                {(size_t)3 << 46, "192 TiB"}};
    size_t k, first = overcommit_always() ? 2 : 0;
    char what[64];
    if (first) fprintf(stderr, "note: vm.overcommit_memory=1: only sizes past the address space\n");
    size_t n = 40 * MiB;
    unsigned char *p = (unsigned char *)ump_malloc(n);
    CHECK(p != NULL, "ump_malloc(40 MiB): %s", last_err_or("-"));
    if (!p) return;
    fill_pattern(p, n, 1);
    for (k = first; k < sizeof huge / sizeof huge[0]; k++) {
        snprintf(what, sizeof what, "40 MiB chunk -> %s", huge[k].what);
        refuse(what, p, n, 1, huge[k].n);
    }

    /* As ump_malloc of the same size does (the control). */
    for (k = first; k < sizeof huge / sizeof huge[0]; k++) {
        struct book a, b;
        book_now(&a);
        void *q = ump_malloc(huge[k].n);
        book_now(&b);
        snprintf(what, sizeof what, "ump_malloc(%s)", huge[k].what);
        CHECK(q == NULL, "%s = %p", what, q);
        same_book(what, &a, &b);
    }

    /* A block at the head of a 64 MiB arena, the rest of the arena free: a refused growth must
     * leave that free memory free (it was merged into the block, which kept it). */
    size_t m = 1 * MiB;
    unsigned char *a = (unsigned char *)ump_malloc(m);
    CHECK(a != NULL, "ump_malloc(1 MiB): %s", last_err_or("-"));
    if (!a) return;
    fill_pattern(a, m, 2);
    struct ump_stats st;
    stats_now(&st);
    CHECK(st.host_largest_free >= 62 * MiB,
          "the 1 MiB block should start an arena whose rest is free: largest_free %.1f MiB",
          MB(st.host_largest_free));
    for (k = first; k < sizeof huge / sizeof huge[0]; k++) {
        snprintf(what, sizeof what, "1 MiB in an arena -> %s", huge[k].what);
        refuse(what, a, m, 2, huge[k].n);
    }
    struct ump_identity id;
    CHECK(identify(a + 32 * MiB, &id) == UMP_OK && !id.ours,
          "ump_identify(block + 32 MiB) says ours (block %#zx, %zu bytes): the free memory "
          "after the block went into it",
          id.base, id.block_size);
    /* The free memory still serves: a 40 MiB block fits the arena's free span. */
    stats_now(&st);
    uint64_t mapped0 = st.host.mapped;
    unsigned char *c = (unsigned char *)ump_malloc(40 * MiB);
    CHECK(c != NULL, "ump_malloc(40 MiB) after the refusal: %s", last_err_or("-"));
    stats_now(&st);
    CHECK(c == a + m, "ump_malloc(40 MiB) = %p, want the free memory after the block (%p)",
          (void *)c, (void *)(a + m));
    CHECK(st.host.mapped == mapped0, "ump_malloc(40 MiB) mapped %.1f MiB more",
          MB(st.host.mapped - mapped0));
    ump_free(c, 40 * MiB);

    /* The address space is still there for the program: under RLIMIT_AS = its size + 4 GiB, a
     * 1 GiB block fits, from ump-alloc and from glibc alike (both failed after 16 GiB of
     * leaves). */
    struct rlimit rl = {vsize_now() + 4 * GiB, vsize_now() + 4 * GiB};
    CHECK(setrlimit(RLIMIT_AS, &rl) == 0, "setrlimit: %s", strerror(errno));
    unsigned char *g = (unsigned char *)ump_malloc(GiB);
    CHECK(g != NULL, "ump_malloc(1 GiB) under RLIMIT_AS = size + 4 GiB: %s", last_err_or("-"));
    if (g) {
        g[0] = 1;
        g[GiB - 1] = 2;
        ump_free(g, GiB);
    }
    unsigned char *h = (unsigned char *)malloc(GiB);
    CHECK(h != NULL, "malloc(1 GiB) under RLIMIT_AS = size + 4 GiB failed");
    free(h);
    block_intact("at the end", p, n, 1);
    block_intact("at the end", a, m, 2);
    ump_free(p, n);
    ump_free(a, m);
}

/* ---- 2. refused growth under UMP_ALLOC_LIMIT=96M ------------------------------------------- */

static void scenario_refused_growth_limit(void) {
    size_t m = 1 * MiB;
    unsigned char *a = (unsigned char *)ump_malloc(m);
    CHECK(a != NULL, "ump_malloc(1 MiB): %s", last_err_or("-"));
    if (!a) return;
    fill_pattern(a, m, 3);
    /* 100 MiB does not fit the limit: growing the arena would pass it, and so would a new
     * block. */
    refuse("1 MiB in an arena -> 100 MiB, limit 96 MiB", a, m, 3, 100 * MiB);
    struct ump_identity id;
    CHECK(identify(a + 32 * MiB, &id) == UMP_OK && !id.ours,
          "ump_identify(block + 32 MiB) says ours (block size %zu): the free memory after the "
          "block went into it",
          id.block_size);
    ump_clear_error();
    unsigned char *c = (unsigned char *)ump_malloc(40 * MiB);
    CHECK(c != NULL, "ump_malloc(40 MiB) after the refusal failed: %s (the arena's 63 MiB of "
          "free memory should serve it under the 96 MiB limit)", last_err_or("-"));
    if (c) {
        fill_pattern(c, 40 * MiB, 4);
        block_intact("a's neighbour", c, 40 * MiB, 4);
        ump_free(c, 40 * MiB);
    }
    block_intact("at the end", a, m, 3);
    ump_free(a, m);
}

/* ---- 3. thread-cached slots and UMP_ALLOC_HOST_RETAIN --------------------------------------- */

/* One block in each of the nine classes from 64 to 256 KiB, each followed by 2 MiB fillers that
 * fill the rest of its 64 MiB arena (a slab of these classes is 4 MiB: 4 + 30 x 2 = 64), so each
 * slab lands in an arena of its own. Everything is then freed. The thread stays alive and
 * allocates nothing more: what stays mapped is what a long-lived idle thread leaves. */
#define S3_CLASSES 9
#define S3_FILLERS 30

static size_t retain_setting(void) {
    const char *v = getenv("UMP_ALLOC_HOST_RETAIN");
    if (!v || !*v) return 256 * MiB;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    switch (*end) {
    case 'K': x <<= 10; break;
    case 'M': x <<= 20; break;
    case 'G': x <<= 30; break;
    default: break;
    }
    return (size_t)x;
}

static const size_t s3_sizes[S3_CLASSES] = {64 * KiB,  80 * KiB,  96 * KiB,
                                            112 * KiB, 128 * KiB, 160 * KiB,
                                            192 * KiB, 224 * KiB, 256 * KiB};
static unsigned char *s3_small[S3_CLASSES];
static unsigned char *s3_fill[S3_CLASSES][S3_FILLERS];

/* Allocate the layout: per class, the block then the fillers of its arena (all touched). */
static void s3_allocate(void) {
    int k, f;
    for (k = 0; k < S3_CLASSES; k++) {
        s3_small[k] = (unsigned char *)ump_malloc(s3_sizes[k]);
        CHECK(s3_small[k] != NULL, "ump_malloc(%zu): %s", s3_sizes[k], last_err_or("-"));
        if (s3_small[k]) memset(s3_small[k], 1, s3_sizes[k]);
        for (f = 0; f < S3_FILLERS; f++) {
            s3_fill[k][f] = (unsigned char *)ump_malloc(2 * MiB);
            CHECK(s3_fill[k][f] != NULL, "ump_malloc(2 MiB): %s", last_err_or("-"));
            if (s3_fill[k][f]) memset(s3_fill[k][f], 2, 2 * MiB);
        }
    }
    struct ump_stats st;
    stats_now(&st);
    /* The layout the scenario needs: nine arenas, each full. */
    CHECK(st.host.mapped >= S3_CLASSES * 64 * MiB,
          "host mapped %.1f MiB with everything live, want >= 576 MiB (one arena per class)",
          MB(st.host.mapped));
}

static void s3_free_small(void) {
    int k;
    for (k = 0; k < S3_CLASSES; k++) ump_free(s3_small[k], s3_sizes[k]);
}

static void s3_free_fillers(int k) {
    int f;
    for (f = 0; f < S3_FILLERS; f++) ump_free(s3_fill[k][f], 2 * MiB);
}

/* With nothing live: what stays mapped is about the retain setting, beside this thread's cache
 * (one slot of each of these classes; about 2 MiB over all classes at most) and the empty
 * slabs a pool keeps within it. */
static void s3_check(const char *order, size_t retain, size_t rss0, uint64_t lag) {
    struct ump_stats st;
    size_t slack = 4 * MiB;
    stats_now(&st);
    size_t rss1 = rss_now();
    fprintf(stderr,
            "note: %s, retain %.0f MiB: host mapped %.1f MiB after the frees (cached %.1f "
            "MiB), RSS %+.1f MiB\n",
            order, MB(retain), MB(st.host.mapped), MB(st.host.cached),
            ((double)rss1 - (double)rss0) / (double)MiB);
    CHECK(st.host.in_use <= lag, "%s: host in_use %" PRIu64 " with nothing live", order,
          st.host.in_use);
    CHECK(st.host.mapped <= retain + slack,
          "%s: host mapped %.1f MiB with nothing live and UMP_ALLOC_HOST_RETAIN=%.0f MiB (want "
          "<= %.0f MiB): cached slots pin their arenas",
          order, MB(st.host.mapped), MB(retain), MB(retain + slack));
    CHECK(rss1 <= rss0 + retain + slack + 16 * MiB,
          "%s: RSS grew by %.1f MiB with nothing live (retain %.0f MiB)", order,
          MB(rss1 - rss0), MB(retain));
}

static pthread_mutex_t s3_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t s3_cv = PTHREAD_COND_INITIALIZER;
static int s3_stage;

/* A worker that makes the layout, frees its small blocks (into its own cache) and then stays
 * alive and idle until told to go. */
static void *s3_worker(void *arg) {
    (void)arg;
    s3_allocate();
    s3_free_small();
    pthread_mutex_lock(&s3_mu);
    s3_stage = 1;
    pthread_cond_broadcast(&s3_cv);
    while (s3_stage != 2) pthread_cond_wait(&s3_cv, &s3_mu);
    pthread_mutex_unlock(&s3_mu);
    return NULL;
}

static void scenario_cache_retain(void) {
    size_t retain = retain_setting(), rss0 = rss_now();
    int k;

    /* Each arena's fillers, then its block: the block's free empties its slab. */
    s3_allocate();
    for (k = 0; k < S3_CLASSES; k++) {
        s3_free_fillers(k);
        ump_free(s3_small[k], s3_sizes[k]);
    }
    s3_check("fillers then block", retain, rss0, 0);
    ump_trim();

    /* The blocks first (their slots wait in this thread's cache), then the fillers. */
    rss0 = rss_now();
    s3_allocate();
    s3_free_small();
    for (k = 0; k < S3_CLASSES; k++) s3_free_fillers(k);
    s3_check("blocks then fillers", retain, rss0, 0);
    ump_trim();

    /* In allocation order: each block, then the fillers after it. */
    rss0 = rss_now();
    s3_allocate();
    for (k = 0; k < S3_CLASSES; k++) {
        ump_free(s3_small[k], s3_sizes[k]);
        s3_free_fillers(k);
    }
    s3_check("allocation order", retain, rss0, 0);
    ump_trim();

    /* Another thread's cache: a worker makes the layout, frees its blocks and stays idle;
     * this thread frees the fillers. */
    rss0 = rss_now();
    pthread_t th;
    int rc = pthread_create(&th, NULL, s3_worker, NULL);
    CHECK(rc == 0, "pthread_create: %d", rc);
    if (rc != 0) return;
    pthread_mutex_lock(&s3_mu);
    while (s3_stage != 1) pthread_cond_wait(&s3_cv, &s3_mu);
    pthread_mutex_unlock(&s3_mu);
    for (k = 0; k < S3_CLASSES; k++) s3_free_fillers(k);
    /* The idle worker's cache has not added its last frees to the shared count (less than
     * 256 KiB per thread, as documented). */
    s3_check("an idle thread's blocks, then fillers from another thread", retain, rss0,
             256 * KiB);
    pthread_mutex_lock(&s3_mu);
    s3_stage = 2;
    pthread_cond_broadcast(&s3_cv);
    pthread_mutex_unlock(&s3_mu);
    pthread_join(th, NULL);

    /* Still usable, and the cache still serves. */
    void *p = ump_malloc(100 * KiB);
    CHECK(p != NULL, "ump_malloc(100 KiB) afterwards: %s", last_err_or("-"));
    ump_free(p, 100 * KiB);
}

/* ---- 4. scopes follow in-place reallocs ---------------------------------------------------- */

static struct ump_scope_report scope_end(void) {
    struct ump_scope_report r;
    memset(&r, 0, sizeof r);
    r.size = (uint32_t)sizeof r;
    CHECK(ump_scope_end_ex(&r) == UMP_OK, "ump_scope_end_ex: %s", last_err_or("-"));
    return r;
}

/* Open a scope, allocate `from` bytes, realloc to `to`; the block must stay where it was when
 * `in_place`; the scope's report must say `to` bytes are live at its end, and at least `to` at
 * its peak. */
static void scope_case(size_t from, size_t to, int in_place, unsigned flags) {
    struct ump_stats s0, s1;
    CHECK(ump_scope_begin_ex(flags) == UMP_OK, "ump_scope_begin_ex: %s", last_err_or("-"));
    unsigned char *p = (unsigned char *)ump_malloc(from);
    CHECK(p != NULL, "ump_malloc(%zu): %s", from, last_err_or("-"));
    if (!p) {
        (void)scope_end();
        return;
    }
    stats_now(&s0);
    unsigned char *q = (unsigned char *)ump_realloc(p, to);
    stats_now(&s1);
    CHECK(q != NULL, "ump_realloc(%zu -> %zu): %s", from, to, last_err_or("-"));
    if (in_place) {
        CHECK(q == p && s1.host_reallocs_in_place == s0.host_reallocs_in_place + 1,
              "ump_realloc(%zu -> %zu) should stay in place: %p -> %p", from, to, (void *)p,
              (void *)q);
    }
    struct ump_scope_report r = scope_end();
    fprintf(stderr, "note: scope: %zu -> %zu (%s): live_bytes %" PRIu64 ", peak_bytes %" PRIu64
            "\n", from, to, q == p ? "in place" : "moved", r.live_bytes, r.peak_bytes);
    CHECK(r.live_blocks == 1 && r.live_bytes == to,
          "scope after ump_realloc(%zu -> %zu): %" PRIu64 " blocks, live_bytes %" PRIu64
          ", want 1 and %zu",
          from, to, r.live_blocks, r.live_bytes, to);
    CHECK(r.peak_bytes >= to && r.peak_bytes >= from,
          "scope after ump_realloc(%zu -> %zu): peak_bytes %" PRIu64, from, to, r.peak_bytes);
    if (flags & UMP_SCOPE_KEEP_LIVE) {
        /* Kept: a free of the block is its first. */
        uint64_t e0 = ump_error_count();
        ump_free(q, to);
        CHECK(ump_error_count() == e0, "free after a keep-live scope: %s", last_err_or("-"));
    }
}

static void scenario_scope_realloc(void) {
    scope_case(1 * MiB, 9 * MiB, 1, 0);               /* grows in place over free memory */
    scope_case(9 * MiB, 1 * MiB, 1, 0);               /* shrinks in place */
    scope_case(100, 110, 1, 0);                       /* a small block within its class */
    scope_case(1 * MiB, 9 * MiB, 1, UMP_SCOPE_KEEP_LIVE);
    scope_case(1000, 100000, 0, 0);                   /* moves: the control */
}

/* A small block resized within its class outside any scope takes the realloc fast path (counted
 * in the thread's cache): the books must be as exact as on the full path. */
static void scenario_realloc_counts(void) {
    struct ump_stats s0, s1, s2;
    stats_now(&s0);
    unsigned char *p = (unsigned char *)ump_malloc(100);
    CHECK(p != NULL, "ump_malloc(100): %s", last_err_or("-"));
    if (!p) return;
    fill_pattern(p, 100, 5);
    unsigned char *q = (unsigned char *)ump_realloc(p, 110);
    stats_now(&s1);
    CHECK(q == p, "ump_realloc(100 -> 110) moved the block: %p -> %p", (void *)p, (void *)q);
    CHECK(check_pattern(q, 100, 5) == SIZE_MAX, "ump_realloc(100 -> 110) lost contents");
    CHECK(s1.host_reallocs_in_place == s0.host_reallocs_in_place + 1,
          "host_reallocs_in_place %" PRIu64 " -> %" PRIu64 ", want +1", s0.host_reallocs_in_place,
          s1.host_reallocs_in_place);
    CHECK(s1.host.in_use == s0.host.in_use + 110, "host in_use %" PRIu64 " -> %" PRIu64
          ", want +110", s0.host.in_use, s1.host.in_use);
    struct ump_identity id;
    CHECK(identify(q + 105, &id) == UMP_OK && id.ours && id.block_size == 110,
          "ump_identify after the realloc: ours %d size %zu", id.ours, id.block_size);
    q = (unsigned char *)ump_realloc(q, 97);
    stats_now(&s2);
    CHECK(q == p && s2.host.in_use == s0.host.in_use + 97,
          "ump_realloc(110 -> 97): %p, in_use +%" PRId64, (void *)q,
          (int64_t)(s2.host.in_use - s0.host.in_use));
    ump_free(q, 97);
    stats_now(&s2);
    CHECK(s2.host.in_use == s0.host.in_use, "host in_use %" PRIu64 " after the free, %" PRIu64
          " before", s2.host.in_use, s0.host.in_use);
}

/* ---- 5. ump_stream_retire and devices that do not exist ------------------------------------ */

static void retire_devices(const char *when) {
    static const int bad[] = {-5, -2, INT_MIN, 0, 1, 64, INT_MAX};
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t e0 = ump_error_count();
        int rc = ump_stream_retire(bad[i], (void *)(uintptr_t)0x1234);
        CHECK(rc == UMP_ERR_INVALID && ump_error_count() == e0 + 1,
              "%s: ump_stream_retire(%d, ...) = %d (errors +%" PRIu64 "), want UMP_ERR_INVALID "
              "on a machine without a GPU",
              when, bad[i], rc, ump_error_count() - e0);
        const char *m = ump_last_error();
        CHECK(m && strstr(m, "device"), "%s: ump_stream_retire(%d): message %s", when, bad[i],
              m ? m : "(none)");
    }
    CHECK(ump_stream_retire(-1, (void *)(uintptr_t)0x1234) == UMP_OK,
          "%s: ump_stream_retire(-1, ...) (every device): %s", when, last_err_or("-"));
}

static void scenario_stream_retire_device(void) {
    retire_devices("before the first allocation");
    void *p = ump_malloc(100);
    CHECK(p != NULL, "ump_malloc(100): %s", last_err_or("-"));
    retire_devices("after the first allocation");
    ump_free(p, 100);
}

/* ---- 6. devices that do not exist, and a block is the bytes asked for (issue 32) --------- */

/* Without a GPU, device 0 stands for the GPU a plan is made for; every other number is no
 * device of this machine, for a plan to a device, for one from a named device, and for access
 * (which says UMP_ERR_UNSUPPORTED first here: there is no GPU to access). Over the stand-in
 * driver of tests/fork (one GPU) ump_device_access refuses the same numbers. */
static void scenario_device_numbers(void) {
    static const int bad[] = {-2, 1, 7, 1 << 20, INT_MIN, INT_MAX};
    struct ump_transfer_plan plan;
    unsigned char *p = ump_malloc(4096);
    CHECK(p != NULL, "ump_malloc: %s", last_err_or("-"));
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memset(&plan, 0x5a, sizeof plan);
        plan.size = (uint32_t)sizeof plan;
        int rc = ump_plan_transfer(p, 4096, UMP_TO_DEVICE, bad[i], 1.0, NULL, &plan);
        CHECK(rc == UMP_ERR_INVALID && strstr(last_err_or(""), "no CUDA device"),
              "ump_plan_transfer(UMP_TO_DEVICE, device %d) = %d: %s", bad[i], rc, last_err_or("-"));
        CHECK((int)plan.path == 0x5a5a5a5a, "a refused plan writes nothing");
        rc = ump_plan_transfer(p, 4096, UMP_TO_HOST, bad[i], 1.0, NULL, &plan);
        CHECK(rc == UMP_ERR_INVALID, "ump_plan_transfer(UMP_TO_HOST, device %d) = %d", bad[i], rc);
        rc = ump_device_access(p, 4096, bad[i], NULL);
        CHECK(rc == UMP_ERR_UNSUPPORTED || rc == UMP_ERR_INVALID, "ump_device_access(device %d) = %d",
              bad[i], rc);
        rc = ump_device_access_ex(p, 4096, bad[i], NULL, 1.0);
        CHECK(rc == UMP_ERR_UNSUPPORTED || rc == UMP_ERR_INVALID,
              "ump_device_access_ex(device %d) = %d", bad[i], rc);
    }
    CHECK(ump_plan_transfer(p, 4096, UMP_TO_DEVICE, 0, 1.0, NULL, &plan) == UMP_OK,
          "device 0: %s", last_err_or("-"));
    CHECK(ump_plan_transfer(p, 4096, UMP_TO_HOST, -1, 1.0, NULL, &plan) == UMP_OK,
          "to the host from the memory's own device (-1): %s", last_err_or("-"));
    ump_free(p, 4096);
}

/* One rule everywhere: a block is the bytes it was asked for, whatever room its slot (small)
 * or span (large) has after them. identify says "ours" inside them only, and a range past them
 * is refused by the plan and by host access. */
static void scenario_requested_size(void) {
    static const size_t sizes[] = {1000, 3000, 100000, 3 * MiB + 123, 40 * MiB + 5};
    size_t i;
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = ump_malloc(n);
        CHECK(p != NULL, "ump_malloc(%zu): %s", n, last_err_or("-"));
        if (!p) continue;
        struct ump_identity id;
        CHECK(identify(p + n - 1, &id) == UMP_OK && id.ours && id.base == (uintptr_t)p &&
                  id.block_size == n,
              "%zu bytes: the last byte is ours", n);
        CHECK(identify(p + n, &id) == UMP_OK && !id.ours,
              "%zu bytes: the byte after the block is not (ours %d, block %zu)", n, id.ours,
              (size_t)id.block_size);
        struct ump_transfer_plan plan;
        plan.size = (uint32_t)sizeof plan;
        CHECK(ump_plan_transfer(p, n, UMP_TO_HOST, -1, 1.0, NULL, &plan) == UMP_OK,
              "%zu bytes: the whole block plans: %s", n, last_err_or("-"));
        CHECK(ump_plan_transfer(p, n + 1, UMP_TO_HOST, -1, 1.0, NULL, &plan) == UMP_ERR_INVALID &&
                  strstr(last_err_or(""), "past the end"),
              "%zu bytes: one byte more is refused: %s", n, last_err_or("-"));
        CHECK(ump_host_access(p + 1, n, NULL) == UMP_ERR_INVALID,
              "%zu bytes: host access one byte past the end is refused", n);
        CHECK(ump_host_access(p + 1, n - 1, NULL) == UMP_OK, "%zu bytes: host access to the end: %s",
              n, last_err_or("-"));
        ump_free(p, n);
    }
}

static const struct scenario scenarios[] = {
    {"refused-growth", scenario_refused_growth},
    {"refused-growth-limit", scenario_refused_growth_limit},
    {"cache-retain", scenario_cache_retain},
    {"scope-realloc", scenario_scope_realloc},
    {"realloc-counts", scenario_realloc_counts},
    {"stream-retire-device", scenario_stream_retire_device},
    {"device-numbers", scenario_device_numbers},
    {"requested-size", scenario_requested_size},
};

int main(int argc, char **argv) {
    return run_scenario("review", scenarios, sizeof scenarios / sizeof scenarios[0], argc, argv);
}
