/* C ABI test of libump_alloc: exercises every function of include/ump_alloc.h.
 *
 * Meant to run clean under AddressSanitizer + UBSan and under valgrind memcheck
 * (see run.sh next to this file).
 *
 *   test_ump                 normal run (alignment from UMP_ALLOC_ALIGNMENT, default 512)
 *   test_ump --bad-config    UMP_ALLOC_ALIGNMENT holds an invalid value: every entry point
 *                            must fail cleanly with UMP_ERR_CONFIG / NULL + ENOMEM.
 *
 * UMP_TEST_QUICK=1 shortens the multi-threaded churn (for valgrind); UMP_TEST_CHURN_ITERS=N
 * sets its iterations per thread. Hot loops (threads) count only their failures.
 * Expects a machine without a usable GPU (mode "host").
 * Prints exactly one summary line "C ABI: N passed, M failed"; exits non-zero if M > 0.
 */

#define _GNU_SOURCE

/* The check machinery (CHECK, the pass/fail counts), sizes, patterns and the small helpers
 * (last_err_or, is_aligned, identify, stats_now, xorshift) shared with the other C tests. */
#include "harness.h"

static size_t g_align = 512; /* expected alignment: UMP_ALLOC_ALIGNMENT or 512 */
static int g_quick = 0;

static int last_err_contains(const char *needle) {
    const char *e = ump_last_error();
    return e != NULL && strstr(e, needle) != NULL;
}

/* The alignment a host block of n bytes must have, by the documented rule, checked against
 * ump_block_alignment(n): the configured alignment from that size up; below it at least 16,
 * and for a power of two n at least n (the natural alignment of its size class). */
static size_t want_align(size_t n) {
    size_t a = ump_block_alignment(n);
    if (n >= g_align) return g_align;
    size_t floor = 16;
    if (n >= 16 && (n & (n - 1)) == 0) floor = n;
    if (a < floor || a > g_align || (a & (a - 1)) != 0) return g_align * 2; /* fails the check */
    return a;
}

/* Offset of the first byte that is not `v`, or SIZE_MAX. */
static size_t first_not(const void *p, size_t n, unsigned char v) {
    const unsigned char *b = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) {
        if (b[i] != v) return i;
    }
    return SIZE_MAX;
}

/* ---- 1. ump_malloc -------------------------------------------------------------------- */

static void test_malloc(void) {
    static const size_t sizes[] = {0,      1,      15,     16,           511,
                                   512,    513,    4096,   100000,       262144,
                                   262145, 3 * MiB, 40 * MiB, 100 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    void *ptrs[N];
    size_t i, j;

    for (i = 0; i < N; i++) {
        size_t n = sizes[i];
        errno = 0;
        ptrs[i] = ump_malloc(n);
        CHECK(ptrs[i] != NULL, "ump_malloc(%zu) returned NULL: %s", n, last_err_or("(no error)"));
        if (!ptrs[i]) continue;
        CHECK(is_aligned(ptrs[i], want_align(n)), "ump_malloc(%zu) = %p not aligned to %zu", n,
              ptrs[i], want_align(n));
        fill_pattern(ptrs[i], n, 0x1000 + i);
        size_t bad = check_pattern(ptrs[i], n, 0x1000 + i);
        CHECK(bad == SIZE_MAX, "ump_malloc(%zu): byte %zu does not read back", n, bad);
    }
    /* Distinct, non-overlapping (a zero-size block still occupies its own address). */
    for (i = 0; i < N; i++) {
        for (j = i + 1; j < N; j++) {
            if (!ptrs[i] || !ptrs[j]) continue;
            uintptr_t a = (uintptr_t)ptrs[i], b = (uintptr_t)ptrs[j];
            size_t na = sizes[i] ? sizes[i] : 1, nb = sizes[j] ? sizes[j] : 1;
            CHECK(a + na <= b || b + nb <= a,
                  "blocks overlap: ump_malloc(%zu)=%p and ump_malloc(%zu)=%p", sizes[i],
                  ptrs[i], sizes[j], ptrs[j]);
        }
    }
    /* Every block still holds its own pattern after all were written. */
    for (i = 0; i < N; i++) {
        if (!ptrs[i]) continue;
        size_t bad = check_pattern(ptrs[i], sizes[i], 0x1000 + i);
        CHECK(bad == SIZE_MAX, "ump_malloc(%zu): byte %zu changed after other writes",
              sizes[i], bad);
    }
    /* malloc(0) is unique and freeable. */
    void *z1 = ump_malloc(0), *z2 = ump_malloc(0);
    CHECK(z1 != NULL && z2 != NULL && z1 != z2, "ump_malloc(0) twice: %p %p (want distinct)",
          z1, z2);
    CHECK(z1 != ptrs[0], "ump_malloc(0) repeated a live pointer");
    struct ump_identity id;
    CHECK(identify(z1, &id) == UMP_OK && id.ours && id.block_size == 0,
          "ump_identify(malloc(0)): ours=%d block_size=%zu", id.ours, id.block_size);
    uint64_t errs = ump_error_count();
    ump_free(z1, 0);
    ump_free(z2, 0);
    for (i = 0; i < N; i++) ump_free(ptrs[i], sizes[i]);
    CHECK(ump_error_count() == errs, "freeing the malloc blocks counted %" PRIu64 " errors: %s",
          ump_error_count() - errs, last_err_or("-"));
}

/* ---- 2. ump_calloc -------------------------------------------------------------------- */

static void test_calloc(void) {
    static const size_t sizes[] = {1, 100, 4096, 100000, 262144, 262145, 1 * MiB, 3 * MiB,
                                   40 * MiB};
    size_t i;
    uint64_t errs = ump_error_count();
    for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        /* Fresh calloc. */
        unsigned char *c = (unsigned char *)ump_calloc(n, 1);
        CHECK(c != NULL, "ump_calloc(%zu, 1) returned NULL", n);
        if (c) {
            CHECK(is_aligned(c, want_align(n)), "ump_calloc(%zu) not aligned", n);
            size_t bad = first_not(c, n, 0);
            CHECK(bad == SIZE_MAX, "fresh ump_calloc(%zu, 1): byte %zu is not zero", n, bad);
            ump_free(c, n);
        }
        /* A dirty block of the same size freed just before: calloc must still zero. */
        unsigned char *d = (unsigned char *)ump_malloc(n);
        CHECK(d != NULL, "ump_malloc(%zu) returned NULL", n);
        if (!d) continue;
        memset(d, 0xFF, n);
        ump_free(d, n);
        size_t elsize = (n % 4 == 0) ? 4 : 1;
        unsigned char *e = (unsigned char *)ump_calloc(n / elsize, elsize);
        CHECK(e != NULL, "ump_calloc(%zu, %zu) returned NULL", n / elsize, elsize);
        if (!e) continue;
        CHECK(is_aligned(e, want_align(n)), "ump_calloc(%zu) not aligned", n);
        size_t bad = first_not(e, n, 0);
        CHECK(bad == SIZE_MAX,
              "ump_calloc(%zu, %zu) after freeing a 0xFF block (%s): byte %zu is 0x%02x, not 0",
              n / elsize, elsize, e == d ? "same block reused" : "other block", bad,
              bad == SIZE_MAX ? 0 : e[bad]);
        ump_free(e, n);
    }
    /* Several dirty small blocks, then a calloc batch of the same class. */
    {
        void *dirty[32];
        for (i = 0; i < 32; i++) {
            dirty[i] = ump_malloc(700);
            if (dirty[i]) memset(dirty[i], 0xEE, 700);
        }
        for (i = 0; i < 32; i++) ump_free(dirty[i], 700);
        for (i = 0; i < 32; i++) {
            dirty[i] = ump_calloc(35, 20);
            CHECK(dirty[i] != NULL, "ump_calloc(35, 20) returned NULL");
            if (dirty[i]) {
                size_t bad = first_not(dirty[i], 700, 0);
                CHECK(bad == SIZE_MAX, "ump_calloc(35, 20) #%zu: byte %zu not zero", i, bad);
            }
        }
        for (i = 0; i < 32; i++) ump_free(dirty[i], 700);
    }
    /* calloc of zero bytes: a unique freeable block. */
    void *z = ump_calloc(0, 16);
    CHECK(z != NULL, "ump_calloc(0, 16) returned NULL");
    ump_free(z, 0);
    z = ump_calloc(16, 0);
    CHECK(z != NULL, "ump_calloc(16, 0) returned NULL");
    ump_free(z, 0);
    CHECK(ump_error_count() == errs, "calloc phase counted %" PRIu64 " unexpected errors: %s",
          ump_error_count() - errs, last_err_or("-"));

    /* Overflow. */
    ump_clear_error();
    errno = 0;
    void *o = ump_calloc(SIZE_MAX / 2, 3);
    int err = errno;
    CHECK(o == NULL, "ump_calloc(SIZE_MAX/2, 3) returned %p", o);
    CHECK(err == ENOMEM, "ump_calloc overflow: errno %d, want ENOMEM", err);
    CHECK(last_err_contains("overflow"), "ump_calloc overflow: last error %s",
          last_err_or("NULL"));
    CHECK(ump_error_count() == errs + 1, "ump_calloc overflow counted %" PRIu64 " errors",
          ump_error_count() - errs);
    errno = 0;
    o = ump_calloc(3, SIZE_MAX / 2);
    CHECK(o == NULL && errno == ENOMEM, "ump_calloc(3, SIZE_MAX/2) = %p errno %d", o, errno);
}

/* ---- 3. ump_realloc ------------------------------------------------------------------- */

static void test_realloc(void) {
    uint64_t errs = ump_error_count();
    struct ump_identity id;

    /* Grow: small -> small (other class) -> large -> larger; then shrink. */
    size_t steps[] = {100, 3000, 300000, 5 * MiB, 64 * MiB, 2 * MiB, 200000, 1000, 10, 200};
    size_t nsteps = sizeof steps / sizeof steps[0], i;
    size_t cur = steps[0];
    unsigned char *p = (unsigned char *)ump_malloc(cur);
    CHECK(p != NULL, "ump_malloc(%zu) returned NULL", cur);
    if (!p) return;
    fill_pattern(p, cur, 77);
    for (i = 1; i < nsteps; i++) {
        size_t n = steps[i];
        unsigned char *q = (unsigned char *)ump_realloc(p, n);
        CHECK(q != NULL, "ump_realloc(%zu -> %zu) returned NULL: %s", cur, n,
              last_err_or("-"));
        if (!q) break;
        CHECK(is_aligned(q, want_align(n)), "ump_realloc(%zu -> %zu) = %p not aligned", cur, n, q);
        size_t keep = cur < n ? cur : n;
        size_t bad = check_pattern(q, keep, 77);
        CHECK(bad == SIZE_MAX, "ump_realloc(%zu -> %zu): byte %zu of the kept contents lost",
              cur, n, bad);
        CHECK(identify(q, &id) == UMP_OK && id.ours && id.base == (size_t)(uintptr_t)q &&
                  id.block_size == n,
              "ump_realloc(%zu -> %zu): identify says ours=%d base=%#zx size=%zu", cur, n,
              id.ours, id.base, id.block_size);
        if (q != p) {
            CHECK(identify(p, &id) == UMP_OK && (!id.ours || id.base != (size_t)(uintptr_t)p),
                  "ump_realloc(%zu -> %zu) moved the block but the old one is still live", cur,
                  n);
        }
        /* The whole new size is writable. */
        fill_pattern(q, n, 77);
        p = q;
        cur = n;
    }
    ump_free(p, cur);

    /* Same-class grow (likely in place) keeps contents too. */
    p = (unsigned char *)ump_malloc(600);
    if (p) {
        fill_pattern(p, 600, 5);
        unsigned char *q = (unsigned char *)ump_realloc(p, 700);
        CHECK(q != NULL && check_pattern(q, 600, 5) == SIZE_MAX,
              "ump_realloc(600 -> 700) lost contents");
        if (q) {
            CHECK(identify(q, &id) == UMP_OK && id.block_size == 700,
                  "ump_realloc(600 -> 700): block_size %zu", id.block_size);
            ump_free(q, 700);
        }
    }

    /* realloc(NULL, n) is malloc. */
    p = (unsigned char *)ump_realloc(NULL, 5000);
    CHECK(p != NULL && is_aligned(p, g_align), "ump_realloc(NULL, 5000) = %p", (void *)p);
    if (p) {
        memset(p, 1, 5000);
        CHECK(identify(p, &id) == UMP_OK && id.ours && id.block_size == 5000,
              "ump_realloc(NULL, 5000): identify ours=%d size=%zu", id.ours, id.block_size);
        ump_free(p, 5000);
    }
    CHECK(ump_error_count() == errs, "realloc phase counted %" PRIu64 " unexpected errors: %s",
          ump_error_count() - errs, last_err_or("-"));

    /* Foreign pointer: libc malloc. */
    unsigned char *f = (unsigned char *)malloc(256);
    CHECK(f != NULL, "libc malloc failed");
    if (f) {
        unsigned char copy[256];
        fill_pattern(f, 256, 9);
        memcpy(copy, f, 256);
        ump_clear_error();
        uint64_t e0 = ump_error_count();
        void *r = ump_realloc(f, 1024);
        CHECK(r == NULL, "ump_realloc(libc pointer) returned %p", r);
        CHECK(ump_error_count() == e0 + 1, "ump_realloc(libc pointer): error count +%" PRIu64,
              ump_error_count() - e0);
        CHECK(ump_last_error() != NULL, "ump_realloc(libc pointer): no last error");
        CHECK(memcmp(copy, f, 256) == 0, "ump_realloc(libc pointer) changed the foreign block");
        free(f);
    }
    /* Foreign pointer: stack. */
    {
        unsigned char stack_buf[128], copy[128];
        fill_pattern(stack_buf, sizeof stack_buf, 10);
        memcpy(copy, stack_buf, sizeof copy);
        ump_clear_error();
        uint64_t e0 = ump_error_count();
        void *r = ump_realloc(stack_buf, 64);
        CHECK(r == NULL, "ump_realloc(stack address) returned %p", r);
        CHECK(ump_error_count() == e0 + 1, "ump_realloc(stack): error count +%" PRIu64,
              ump_error_count() - e0);
        CHECK(ump_last_error() != NULL, "ump_realloc(stack): no last error");
        CHECK(memcmp(copy, stack_buf, sizeof copy) == 0,
              "ump_realloc(stack address) changed the stack buffer");
    }
    /* Interior pointer of a live block: refused, block left alone. */
    p = (unsigned char *)ump_malloc(1000);
    if (p) {
        fill_pattern(p, 1000, 11);
        uint64_t e0 = ump_error_count();
        void *r = ump_realloc(p + 16, 2000);
        CHECK(r == NULL, "ump_realloc(interior pointer) returned %p", r);
        CHECK(ump_error_count() == e0 + 1, "ump_realloc(interior): error count +%" PRIu64,
              ump_error_count() - e0);
        CHECK(check_pattern(p, 1000, 11) == SIZE_MAX, "ump_realloc(interior) changed the block");
        ump_free(p, 1000);
    }

    /* Large block resized inside its capacity (same number of 64 KiB granules), both ways,
     * then freed dirty: a calloc of the same size must still read as zero. */
    p = (unsigned char *)ump_malloc(300000);
    if (p) {
        fill_pattern(p, 300000, 13);
        unsigned char *q = (unsigned char *)ump_realloc(p, 320000);
        CHECK(q != NULL && check_pattern(q, 300000, 13) == SIZE_MAX,
              "ump_realloc(300000 -> 320000) lost contents");
        if (q) {
            CHECK(identify(q, &id) == UMP_OK && id.ours && id.block_size == 320000,
                  "ump_realloc(300000 -> 320000): block_size %zu", id.block_size);
            memset(q, 0xFF, 320000);
            unsigned char *r = (unsigned char *)ump_realloc(q, 290000);
            CHECK(r != NULL && first_not(r, 290000, 0xFF) == SIZE_MAX,
                  "ump_realloc(320000 -> 290000) lost contents");
            if (r) {
                CHECK(identify(r, &id) == UMP_OK && id.ours && id.block_size == 290000,
                      "ump_realloc(320000 -> 290000): block_size %zu", id.block_size);
                ump_free(r, 290000);
            }
            unsigned char *c = (unsigned char *)ump_calloc(320000, 1);
            CHECK(c != NULL && first_not(c, 320000, 0) == SIZE_MAX,
                  "ump_calloc(320000) after a dirty in-place-resized block is not zero");
            ump_free(c, 320000);
        }
    }
    /* realloc(p, 0) gives a freeable block (or NULL); it must not crash or count an error. */
    p = (unsigned char *)ump_malloc(100);
    if (p) {
        uint64_t e1 = ump_error_count();
        void *r = ump_realloc(p, 0);
        CHECK(ump_error_count() == e1, "ump_realloc(p, 0) counted an error: %s",
              last_err_or("-"));
        ump_free(r ? r : p, 0);
    }
    /* Freed and wild pointers are refused. */
    p = (unsigned char *)ump_malloc(5000);
    if (p) {
        ump_free(p, 5000);
        uint64_t e1 = ump_error_count();
        void *r = ump_realloc(p, 6000);
        CHECK(r == NULL && ump_error_count() == e1 + 1,
              "ump_realloc(freed pointer) = %p, error count +%" PRIu64, r,
              ump_error_count() - e1);
    }
    {
        uint64_t e1 = ump_error_count();
        void *r = ump_realloc((void *)(uintptr_t)0x1000, 10);
        CHECK(r == NULL && ump_error_count() == e1 + 1, "ump_realloc(0x1000) = %p", r);
        r = ump_realloc((void *)(~(uintptr_t)0 - 4095), 10);
        CHECK(r == NULL && ump_error_count() == e1 + 2, "ump_realloc(0xfff..f000) = %p", r);
    }

    /* Impossible size: NULL, old block valid and intact (small and large blocks). */
    size_t olds[] = {300, 1 * MiB};
    for (i = 0; i < 2; i++) {
        size_t n = olds[i];
        p = (unsigned char *)ump_malloc(n);
        CHECK(p != NULL, "ump_malloc(%zu) returned NULL", n);
        if (!p) continue;
        fill_pattern(p, n, 12 + i);
        errno = 0;
        ump_clear_error();
        uint64_t e0 = ump_error_count();
        void *r = ump_realloc(p, SIZE_MAX - 4096);
        int err = errno;
        CHECK(r == NULL, "ump_realloc(%zu -> SIZE_MAX-4096) returned %p", n, r);
        CHECK(err == ENOMEM, "ump_realloc(-> SIZE_MAX-4096): errno %d, want ENOMEM", err);
        CHECK(ump_last_error() != NULL, "ump_realloc(-> SIZE_MAX-4096): no last error");
        CHECK(ump_error_count() == e0 + 1, "ump_realloc(-> SIZE_MAX-4096): error count +%" PRIu64,
              ump_error_count() - e0);
        CHECK(check_pattern(p, n, 12 + i) == SIZE_MAX,
              "ump_realloc(%zu -> SIZE_MAX-4096) damaged the old block", n);
        CHECK(identify(p, &id) == UMP_OK && id.ours && id.block_size == n,
              "after failed realloc the old %zu-byte block is not live (ours=%d size=%zu)", n,
              id.ours, id.block_size);
        /* Still usable: realloc it normally and free it. */
        unsigned char *q = (unsigned char *)ump_realloc(p, n * 2);
        CHECK(q != NULL && check_pattern(q, n, 12 + i) == SIZE_MAX,
              "realloc after a failed realloc lost contents");
        ump_free(q ? q : p, n * 2);
    }
}

/* ---- 4. ump_free and error reporting -------------------------------------------------- */

/* Bytes of RAM + swap from /proc/meminfo, or 0 when unknown. */
static uint64_t ram_plus_swap(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    uint64_t total = 0, kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "MemTotal: %" SCNu64 " kB", &kb) == 1 ||
            sscanf(line, "SwapTotal: %" SCNu64 " kB", &kb) == 1)
            total += kb * 1024;
    }
    fclose(f);
    return total;
}

/* /proc/sys/vm/overcommit_memory (0 heuristic, 1 always, 2 never), or -1. */
static int overcommit_policy(void) {
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int v = -1;
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

static void expect_bad_free(void *ptr, const char *what) {
    ump_clear_error();
    uint64_t e0 = ump_error_count();
    ump_free(ptr, 64);
    uint64_t d = ump_error_count() - e0;
    CHECK(d == 1, "ump_free(%s): error count +%" PRIu64 ", want +1", what, d);
    CHECK(ump_last_error() != NULL && ump_last_error()[0] != '\0',
          "ump_free(%s): ump_last_error() is NULL/empty", what);
}

static void test_free_errors(void) {
    uint64_t e0 = ump_error_count();
    ump_free(NULL, 0);
    ump_free(NULL, 12345);
    CHECK(ump_error_count() == e0, "ump_free(NULL) counted an error");

    /* libc pointer. */
    unsigned char *f = (unsigned char *)malloc(64);
    if (f) {
        memset(f, 0x5A, 64);
        expect_bad_free(f, "libc malloc pointer");
        CHECK(first_not(f, 64, 0x5A) == SIZE_MAX, "ump_free(libc pointer) changed it");
        free(f);
    }
    /* Stack address. */
    {
        unsigned char buf[64];
        memset(buf, 0x3C, sizeof buf);
        expect_bad_free(buf, "stack address");
        CHECK(first_not(buf, sizeof buf, 0x3C) == SIZE_MAX, "ump_free(stack) changed it");
    }
    /* Interior pointers of live blocks (small and large): refused, block stays live. */
    size_t live_sizes[] = {200, 1 * MiB};
    size_t i;
    for (i = 0; i < 2; i++) {
        size_t n = live_sizes[i];
        unsigned char *p = (unsigned char *)ump_malloc(n);
        CHECK(p != NULL, "ump_malloc(%zu) returned NULL", n);
        if (!p) continue;
        fill_pattern(p, n, 40 + i);
        expect_bad_free(p + 16, n < MiB ? "interior pointer p+16 (small)"
                                         : "interior pointer p+16 (1 MiB)");
        struct ump_identity id;
        CHECK(identify(p, &id) == UMP_OK && id.ours && id.block_size == n,
              "after an interior free the %zu-byte block is not live", n);
        CHECK(check_pattern(p, n, 40 + i) == SIZE_MAX, "interior free damaged the block");
        uint64_t e1 = ump_error_count();
        ump_free(p, n);
        CHECK(ump_error_count() == e1, "proper free after an interior free failed: %s",
              last_err_or("-"));
    }
    /* Double frees: small block and 1 MiB block. */
    for (i = 0; i < 2; i++) {
        size_t n = i == 0 ? 48 : 1 * MiB;
        void *p = ump_malloc(n);
        CHECK(p != NULL, "ump_malloc(%zu) returned NULL", n);
        if (!p) continue;
        ump_free(p, n);
        expect_bad_free(p, n < MiB ? "double free (small)" : "double free (1 MiB)");
        /* The free list must not now hold the block twice: two allocations of the same
         * size must be distinct. */
        void *a = ump_malloc(n), *b = ump_malloc(n);
        CHECK(a != NULL && b != NULL && a != b,
              "after a double free of a %zu-byte block, two ump_malloc(%zu) gave %p and %p", n,
              n, a, b);
        if (a) memset(a, 0x11, n);
        if (b) memset(b, 0x22, n);
        CHECK(a == NULL || first_not(a, n, 0x11) == SIZE_MAX,
              "after a double free, block a was overwritten by block b");
        uint64_t e1 = ump_error_count();
        ump_free(a, n);
        ump_free(b, n);
        CHECK(ump_error_count() == e1, "freeing after a double free counted an error: %s",
              last_err_or("-"));
    }
    /* Still works. */
    {
        void *p = ump_malloc(4000), *q = ump_malloc(3 * MiB);
        CHECK(p != NULL && q != NULL, "allocator broken after bad frees");
        if (p) memset(p, 7, 4000);
        if (q) memset(q, 8, 3 * MiB);
        uint64_t e1 = ump_error_count();
        ump_free(p, 4000);
        ump_free(q, 3 * MiB);
        CHECK(ump_error_count() == e1, "free after bad frees counted an error");
    }
    /* Wild addresses (unmapped low page, beyond the user address space, odd). */
    {
        void *wild[] = {(void *)(uintptr_t)0x1000, (void *)(uintptr_t)0x10,
                        (void *)(~(uintptr_t)0 - 4095), (void *)(~(uintptr_t)0),
                        (void *)((uintptr_t)1 << 47)};
        for (i = 0; i < sizeof wild / sizeof wild[0]; i++) {
            char what[64];
            snprintf(what, sizeof what, "wild address %p", wild[i]);
            expect_bad_free(wild[i], what);
        }
        void *p = ump_malloc(64);
        if (p) {
            expect_bad_free((unsigned char *)p + 1, "p+1 (odd interior)");
            ump_free(p, 64);
        }
    }
    /* The last error survives successful calls (valid until the next failing call). */
    {
        ump_free((void *)&e0, 0);
        const char *msg = ump_last_error();
        char copy[512] = "";
        if (msg) snprintf(copy, sizeof copy, "%s", msg);
        void *p = ump_malloc(10);
        ump_free(p, 10);
        struct ump_identity id;
        (void)identify(p, &id);
        (void)ump_alignment();
        CHECK(msg != NULL && ump_last_error() == msg && strcmp(ump_last_error(), copy) == 0,
              "ump_last_error() changed across successful calls");
    }
    /* clear_error. */
    ump_free((void *)&e0, 0);
    CHECK(ump_last_error() != NULL, "no last error after a bad free");
    ump_clear_error();
    CHECK(ump_last_error() == NULL, "ump_clear_error() left %s", last_err_or("-"));
    ump_clear_error(); /* idempotent */
    CHECK(ump_last_error() == NULL, "second ump_clear_error() left an error");

    /* Impossible sizes. */
    size_t huge[] = {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX / 2 + 1};
    for (i = 0; i < 3; i++) {
        errno = 0;
        ump_clear_error();
        uint64_t e1 = ump_error_count();
        void *p = ump_malloc(huge[i]);
        int err = errno;
        CHECK(p == NULL, "ump_malloc(%zu) returned %p", huge[i], p);
        CHECK(err == ENOMEM, "ump_malloc(%zu): errno %d, want ENOMEM", huge[i], err);
        CHECK(ump_last_error() != NULL, "ump_malloc(%zu): no last error", huge[i]);
        CHECK(ump_error_count() == e1 + 1, "ump_malloc(%zu): error count +%" PRIu64, huge[i],
              ump_error_count() - e1);
    }
    /* A request the system cannot back: twice RAM + swap. Under the kernel's default
     * overcommit policy (0, heuristic) or strict accounting (2), malloc() fails with ENOMEM
     * for it; ump_malloc must too ("NULL (errno ENOMEM) when memory fails") rather than hand
     * out an address range that cannot be touched (and, in the library, cost a registry entry
     * per 64 KiB: 1/8192 of the request in resident memory). */
    {
        uint64_t mem = ram_plus_swap();
        int policy = overcommit_policy();
        if (mem != 0 && (policy == 0 || policy == 2) && mem < ((uint64_t)1 << 44)) {
            size_t n = (size_t)(2 * mem);
            errno = 0;
            void *p = ump_malloc(n);
            int err = errno;
            CHECK(p == NULL && err == ENOMEM,
                  "ump_malloc(%zu) (2 x RAM+swap, vm.overcommit_memory=%d) = %p, errno %d: "
                  "want NULL + ENOMEM as malloc() gives",
                  n, policy, p, err);
            if (p) ump_free(p, n);
            /* If that succeeded, make sure no cached (dirty) chunk of that size is left for
             * calloc to clear byte by byte. */
            (void)ump_trim();
            errno = 0;
            p = ump_calloc(n / 8, 8);
            err = errno;
            CHECK(p == NULL && err == ENOMEM,
                  "ump_calloc(%zu, 8) (2 x RAM+swap) = %p, errno %d: want NULL + ENOMEM", n / 8,
                  p, err);
            if (p) ump_free(p, n);
        } else {
            fprintf(stderr, "note: skipped the beyond-RAM+swap check (overcommit policy %d)\n",
                    policy);
        }
    }
}

/* ---- 5. ump_identify ------------------------------------------------------------------ */

static void check_ours(const void *block, size_t n, const void *at, const char *where) {
    struct ump_identity id;
    memset(&id, 0xA5, sizeof id);
    id.size = (uint32_t)sizeof id;
    int rc = ump_identify(at, &id);
    CHECK(rc == UMP_OK, "ump_identify(%zu-byte block, %s) = %d", n, where, rc);
    CHECK(id.size == sizeof id, "ump_identify: size out %u", id.size);
    CHECK(id.version == UMP_IDENTITY_VERSION, "ump_identify: version %u", id.version);
    CHECK(id.ours == true, "ump_identify(%zu-byte block, %s): ours false", n, where);
    CHECK(id.base == (size_t)(uintptr_t)block, "ump_identify(%zu, %s): base %#zx want %p", n,
          where, id.base, block);
    CHECK(id.block_size == n, "ump_identify(%zu, %s): block_size %zu", n, where, id.block_size);
    CHECK(id.kind == UMP_KIND_HOST, "ump_identify(%zu, %s): kind %d want HOST", n, where,
          (int)id.kind);
    CHECK(id.host_accessible == true, "ump_identify(%zu, %s): not host accessible", n, where);
    CHECK(id.device_accessible == false, "ump_identify(%zu, %s): device accessible without GPU",
          n, where);
    CHECK(id.device == -1, "ump_identify(%zu, %s): device %d want -1", n, where, id.device);
}

static void check_foreign(const void *p, const char *what) {
    struct ump_identity id;
    memset(&id, 0xA5, sizeof id);
    id.size = (uint32_t)sizeof id;
    int rc = ump_identify(p, &id);
    CHECK(rc == UMP_OK, "ump_identify(%s) = %d", what, rc);
    CHECK(id.ours == false, "ump_identify(%s): ours true", what);
    CHECK(id.kind == UMP_KIND_FOREIGN_HOST, "ump_identify(%s): kind %d want FOREIGN_HOST", what,
          (int)id.kind);
    CHECK(id.host_accessible == true, "ump_identify(%s): not host accessible", what);
    CHECK(id.base == 0 && id.block_size == 0, "ump_identify(%s): base %#zx size %zu", what,
          id.base, id.block_size);
    CHECK(id.device == -1, "ump_identify(%s): device %d", what, id.device);
}

static void test_identify(void) {
    static const size_t sizes[] = {1, 100, 4096, 100000, 262144, 262145, 1 * MiB, 3 * MiB};
    enum { N = sizeof sizes / sizeof sizes[0] };
    unsigned char *blocks[N];
    size_t i;
    uint64_t errs = ump_error_count();

    for (i = 0; i < N; i++) {
        size_t n = sizes[i];
        blocks[i] = (unsigned char *)ump_malloc(n);
        CHECK(blocks[i] != NULL, "ump_malloc(%zu) returned NULL", n);
    }
    for (i = 0; i < N; i++) {
        size_t n = sizes[i];
        unsigned char *b = blocks[i];
        if (!b) continue;
        check_ours(b, n, b, "start");
        check_ours(b, n, b + n / 2, "middle");
        check_ours(b, n, b + n - 1, "last byte");
        CHECK(ump_owns(b) == 1, "ump_owns(start of a live %zu-byte block) = 0", n);
        CHECK(ump_owns(b + n / 2 + 1) == 0, "ump_owns(inside a %zu-byte block) = 1", n);
    }
    {
        int local = 0;
        void *foreign = malloc(64);
        CHECK(ump_owns(NULL) == 0 && ump_owns(&local) == 0 && ump_owns(foreign) == 0,
              "ump_owns of NULL, the stack or malloc memory is 1");
        free(foreign);
    }
    for (i = 0; i < N; i++) {
        if (!blocks[i]) continue;
        ump_free(blocks[i], sizes[i]);
        struct ump_identity id;
        CHECK(identify(blocks[i], &id) == UMP_OK && id.ours == false,
              "ump_identify(freed %zu-byte block): ours true", sizes[i]);
        CHECK(identify(blocks[i] + sizes[i] / 2, &id) == UMP_OK && id.ours == false,
              "ump_identify(middle of freed %zu-byte block): ours true", sizes[i]);
        CHECK(ump_owns(blocks[i]) == 0, "ump_owns(freed %zu-byte block) = 1", sizes[i]);
    }
    /* Foreign host memory. */
    {
        int on_stack = 42;
        check_foreign(&on_stack, "stack variable");
        void *m = malloc(100);
        if (m) {
            check_foreign(m, "libc malloc pointer");
            free(m);
        }
        static char in_data[64] = {1};
        check_foreign(in_data, "static data");
    }
    /* Unmapped and out-of-range addresses: not ours, unknown, not accessible. */
    {
        const void *wild[] = {(const void *)(uintptr_t)0x10, (const void *)(uintptr_t)0x1000,
                              (const void *)(~(uintptr_t)0 - 4095),
                              (const void *)((uintptr_t)1 << 47)};
        for (i = 0; i < sizeof wild / sizeof wild[0]; i++) {
            struct ump_identity id;
            int rc = identify(wild[i], &id);
            CHECK(rc == UMP_OK && !id.ours && id.kind == UMP_KIND_UNKNOWN && !id.host_accessible,
                  "ump_identify(%p): rc %d ours %d kind %d host %d", wild[i], rc, id.ours,
                  (int)id.kind, id.host_accessible);
        }
    }
    /* NULL address. */
    {
        struct ump_identity id;
        memset(&id, 0xA5, sizeof id);
        id.size = (uint32_t)sizeof id;
        int rc = ump_identify(NULL, &id);
        CHECK(rc == UMP_OK, "ump_identify(NULL) = %d", rc);
        CHECK(id.ours == false && id.kind == UMP_KIND_UNKNOWN,
              "ump_identify(NULL): ours=%d kind=%d", id.ours, (int)id.kind);
        CHECK(id.host_accessible == false && id.base == 0 && id.block_size == 0,
              "ump_identify(NULL): host_accessible=%d base=%#zx", id.host_accessible, id.base);
    }
    CHECK(ump_error_count() == errs, "identify counted %" PRIu64 " errors",
          ump_error_count() - errs);

    /* NULL out. */
    {
        int x = 0;
        ump_clear_error();
        int rc = ump_identify(&x, NULL);
        CHECK(rc == UMP_ERR_NULL, "ump_identify(p, NULL) = %d want UMP_ERR_NULL", rc);
        CHECK(ump_last_error() != NULL, "ump_identify(p, NULL): no last error");
    }
    /* Too-small size: UMP_ERR_INVALID and nothing written. */
    {
        void *b = ump_malloc(64);
        uint32_t bad_sizes[] = {4, 1, 7};
        for (i = 0; i < 3; i++) {
            struct ump_identity id, sentinel;
            memset(&id, 0xA5, sizeof id);
            id.size = bad_sizes[i];
            memcpy(&sentinel, &id, sizeof id);
            int rc = ump_identify(b, &id);
            CHECK(rc == UMP_ERR_INVALID, "ump_identify with size=%u = %d want UMP_ERR_INVALID",
                  bad_sizes[i], rc);
            CHECK(memcmp(&id, &sentinel, sizeof id) == 0,
                  "ump_identify with size=%u wrote the out struct on failure", bad_sizes[i]);
        }
        /* size = 8: only the header is written. */
        {
            struct ump_identity id;
            unsigned char ref[sizeof id];
            memset(&id, 0xA5, sizeof id);
            id.size = 8;
            memcpy(ref, &id, sizeof id);
            int rc = ump_identify(b, &id);
            CHECK(rc == UMP_OK, "ump_identify with size=8 = %d", rc);
            CHECK(id.size == 8 && id.version == UMP_IDENTITY_VERSION,
                  "ump_identify size=8: size %u version %u", id.size, id.version);
            CHECK(memcmp((unsigned char *)&id + 8, ref + 8, sizeof id - 8) == 0,
                  "ump_identify size=8 wrote past the first 8 bytes");
        }
        /* size = 0: the current size. */
        {
            struct ump_identity id;
            memset(&id, 0xA5, sizeof id);
            id.size = 0;
            int rc = ump_identify(b, &id);
            CHECK(rc == UMP_OK && id.size == sizeof id && id.ours && id.block_size == 64,
                  "ump_identify size=0: rc %d size %u ours %d", rc, id.size, id.ours);
        }
        /* size larger than the struct: clamped to what the library knows. */
        {
            struct {
                struct ump_identity id;
                unsigned char tail[32];
            } big;
            memset(&big, 0xA5, sizeof big);
            big.id.size = (uint32_t)sizeof big;
            int rc = ump_identify(b, &big.id);
            CHECK(rc == UMP_OK && big.id.size == sizeof big.id && big.id.ours,
                  "ump_identify with a larger size: rc %d size out %u", rc, big.id.size);
            CHECK(first_not(big.tail, sizeof big.tail, 0xA5) == SIZE_MAX,
                  "ump_identify wrote past sizeof(struct ump_identity)");
        }
        ump_free(b, 64);
    }
}

/* ---- 6. ump_capabilities -------------------------------------------------------------- */

static void test_capabilities(int expect_fixed) {
    struct ump_capabilities caps;
    memset(&caps, 0xA5, sizeof caps);
    caps.size = (uint32_t)sizeof caps;
    int rc = ump_capabilities(&caps);
    CHECK(rc == UMP_OK, "ump_capabilities = %d (%s)", rc, last_err_or("-"));
    if (rc != UMP_OK) return;
    CHECK(caps.size == sizeof caps, "ump_capabilities: size %u want %zu", caps.size,
          sizeof caps);
    CHECK(caps.version == UMP_CAPABILITIES_VERSION, "ump_capabilities: version %u",
          caps.version);
    CHECK(caps.cuda_available == false, "ump_capabilities: cuda_available on a GPU-less host");
    CHECK(caps.device_count == 0, "ump_capabilities: device_count %d", caps.device_count);
    CHECK(caps.driver_version == 0, "ump_capabilities: driver_version %d", caps.driver_version);
    CHECK(caps.has_prefetch_v2 == false, "ump_capabilities: has_prefetch_v2 without CUDA");
    CHECK(caps.mode == UMP_MODE_HOST, "ump_capabilities: mode %d want HOST", (int)caps.mode);
    CHECK(caps.alignment == g_align, "ump_capabilities: alignment %zu want %zu",
          caps.alignment, g_align);
    CHECK(caps.mode_fixed == (expect_fixed != 0), "ump_capabilities: mode_fixed %d want %d",
          caps.mode_fixed, expect_fixed);
    CHECK(memchr(caps.mode_reason, 0, sizeof caps.mode_reason) != NULL,
          "ump_capabilities: mode_reason not NUL-terminated");
    CHECK(caps.mode_reason[0] != '\0', "ump_capabilities: mode_reason empty");
    /* No devices: the device table is zeroed, not left as the caller's bytes. */
    CHECK(caps.devices[0].ordinal == 0 && caps.devices[0].name[0] == '\0',
          "ump_capabilities: devices[0] not cleared");

    /* size 0 means the current size. */
    memset(&caps, 0, sizeof caps);
    rc = ump_capabilities(&caps);
    CHECK(rc == UMP_OK && caps.size == sizeof caps && caps.version == UMP_CAPABILITIES_VERSION,
          "ump_capabilities(size 0): rc %d size %u", rc, caps.size);

    /* Too small: invalid, nothing written. */
    {
        struct ump_capabilities c2, ref;
        memset(&c2, 0xA5, sizeof c2);
        c2.size = 4;
        memcpy(&ref, &c2, sizeof c2);
        rc = ump_capabilities(&c2);
        CHECK(rc == UMP_ERR_INVALID, "ump_capabilities(size 4) = %d want UMP_ERR_INVALID", rc);
        CHECK(memcmp(&c2, &ref, sizeof c2) == 0, "ump_capabilities(size 4) wrote the struct");
    }
    /* Only the first `size` bytes. */
    {
        struct ump_capabilities c3;
        unsigned char ref[sizeof c3];
        memset(&c3, 0xA5, sizeof c3);
        c3.size = 16;
        memcpy(ref, &c3, sizeof c3);
        rc = ump_capabilities(&c3);
        CHECK(rc == UMP_OK && c3.size == 16 && c3.version == UMP_CAPABILITIES_VERSION,
              "ump_capabilities(size 16): rc %d size %u", rc, c3.size);
        CHECK(memcmp((unsigned char *)&c3 + 16, ref + 16, sizeof c3 - 16) == 0,
              "ump_capabilities(size 16) wrote past 16 bytes");
    }
    rc = ump_capabilities(NULL);
    CHECK(rc == UMP_ERR_NULL, "ump_capabilities(NULL) = %d want UMP_ERR_NULL", rc);
}

/* ---- 7. init, mode, alignment, version, trim ------------------------------------------ */

static void test_before_init(void) {
    CHECK(ump_current_mode() == UMP_MODE_UNSET, "ump_current_mode() before init = %d",
          (int)ump_current_mode());
    CHECK(ump_alignment() == g_align, "ump_alignment() before init = %zu want %zu",
          ump_alignment(), g_align);
    test_capabilities(0);
    CHECK(ump_config_check() == UMP_OK, "ump_config_check() before init = %s",
          last_err_or("-"));
    /* A GPU mode this machine cannot do is refused now, with the missing capability. */
    uint64_t e0 = ump_error_count();
    ump_clear_error();
    int rc = ump_set_mode("managed");
    CHECK(rc == UMP_ERR_UNSUPPORTED, "ump_set_mode(\"managed\") before init = %d", rc);
    CHECK(ump_last_error() != NULL, "ump_set_mode(\"managed\"): no last error");
    CHECK(ump_error_count() == e0 + 1, "ump_set_mode(\"managed\"): error count +%" PRIu64,
          ump_error_count() - e0);
    CHECK(ump_current_mode() == UMP_MODE_UNSET, "a refused ump_set_mode fixed the mode");
    rc = ump_set_alignment(3);
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_alignment(3) before init = %d want UMP_ERR_CONFIG", rc);
    rc = ump_set_alignment(0);
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_alignment(0) = %d want UMP_ERR_CONFIG", rc);
    rc = ump_set_alignment(8);
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_alignment(8) = %d want UMP_ERR_CONFIG", rc);
    rc = ump_set_alignment(131072);
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_alignment(131072) = %d want UMP_ERR_CONFIG", rc);
    CHECK(ump_alignment() == g_align, "a refused ump_set_alignment changed the alignment");
    rc = ump_set_limit(NULL);
    CHECK(rc == UMP_ERR_NULL, "ump_set_limit(NULL) = %d want UMP_ERR_NULL", rc);
    rc = ump_set_limit("0");
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_limit(\"0\") = %d want UMP_ERR_CONFIG", rc);
    rc = ump_set_limit("lots");
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_limit(\"lots\") = %d want UMP_ERR_CONFIG", rc);
    /* The environment's limit (run.sh unsets UMP_ALLOC_LIMIT), requested again: accepted. */
    rc = ump_set_limit(" none ");
    CHECK(rc == UMP_OK, "ump_set_limit(\" none \") before init = %d (%s)", rc, last_err_or("-"));
}

static void test_init_and_config(void) {
    int rc = ump_init();
    CHECK(rc == UMP_OK, "ump_init() = %d (%s)", rc, last_err_or("-"));
    CHECK(ump_init() == UMP_OK, "second ump_init() failed");
    CHECK(ump_current_mode() == UMP_MODE_HOST, "ump_current_mode() = %d want HOST",
          (int)ump_current_mode());
    CHECK(ump_alignment() == g_align, "ump_alignment() = %zu want %zu", ump_alignment(),
          g_align);

    uint64_t e0 = ump_error_count();
    rc = ump_set_alignment(g_align);
    CHECK(rc == UMP_OK, "ump_set_alignment(%zu) (the one in force) = %d", g_align, rc);
    size_t other = g_align == 4096 ? 512 : 4096;
    rc = ump_set_alignment(other);
    CHECK(rc == UMP_ERR_LOCKED, "ump_set_alignment(%zu) after init = %d want UMP_ERR_LOCKED",
          other, rc);
    CHECK(ump_last_error() != NULL, "ump_set_alignment LOCKED: no last error");
    rc = ump_set_alignment(3);
    CHECK(rc == UMP_ERR_CONFIG, "ump_set_alignment(3) = %d want UMP_ERR_CONFIG", rc);
    CHECK(ump_alignment() == g_align, "alignment changed after refused ump_set_alignment");

    rc = ump_set_limit("none");
    CHECK(rc == UMP_OK, "ump_set_limit(\"none\") (the limit in force) = %d (%s)", rc,
          last_err_or("-"));
    rc = ump_set_limit("1T");
    CHECK(rc == UMP_ERR_LOCKED, "ump_set_limit(\"1T\") after init = %d want UMP_ERR_LOCKED", rc);
    rc = ump_set_mode("host");
    CHECK(rc == UMP_OK, "ump_set_mode(\"host\") = %d (%s)", rc, last_err_or("-"));
    rc = ump_set_mode("auto");
    CHECK(rc == UMP_OK, "ump_set_mode(\"auto\") after auto selected host = %d (%s)", rc,
          last_err_or("-"));
    rc = ump_set_mode("HOST");
    CHECK(rc == UMP_OK, "ump_set_mode(\"HOST\") = %d", rc);
    rc = ump_set_mode("managed");
    CHECK(rc == UMP_ERR_LOCKED || rc == UMP_ERR_UNSUPPORTED,
          "ump_set_mode(\"managed\") = %d want LOCKED or UNSUPPORTED", rc);
    rc = ump_set_mode("device");
    CHECK(rc == UMP_ERR_LOCKED || rc == UMP_ERR_UNSUPPORTED,
          "ump_set_mode(\"device\") = %d want LOCKED or UNSUPPORTED", rc);
    rc = ump_set_mode(NULL);
    CHECK(rc == UMP_ERR_NULL, "ump_set_mode(NULL) = %d want UMP_ERR_NULL", rc);
    rc = ump_set_mode("bogus");
    CHECK(rc == UMP_ERR_INVALID, "ump_set_mode(\"bogus\") = %d want UMP_ERR_INVALID", rc);
    rc = ump_set_mode("");
    CHECK(rc == UMP_ERR_INVALID, "ump_set_mode(\"\") = %d want UMP_ERR_INVALID", rc);
    CHECK(ump_current_mode() == UMP_MODE_HOST, "mode changed after refused ump_set_mode");
    /* Failures above: LOCKED, CONFIG, limit LOCKED, managed, device, NULL, bogus, "" = 8. */
    CHECK(ump_error_count() == e0 + 8, "configuration calls counted %" PRIu64 " errors, want 8",
          ump_error_count() - e0);

    const char *v = ump_version();
    CHECK(v != NULL && v[0] != '\0', "ump_version() NULL or empty");
    CHECK(v != NULL && strchr(v, '.') != NULL, "ump_version() = \"%s\" has no dot",
          v ? v : "NULL");

    test_capabilities(1);

    /* trim after freeing a 40 MiB block. */
    {
        void *p = ump_malloc(40 * MiB);
        CHECK(p != NULL, "ump_malloc(40 MiB) returned NULL");
        if (p) memset(p, 0x77, 40 * MiB);
        ump_free(p, 40 * MiB);
        size_t t = ump_trim();
        fprintf(stderr, "note: ump_trim() gave back %zu bytes\n", t);
        /* With the default UMP_ALLOC_HOST_RETAIN the freed 40 MiB chunk is cached until now. */
        if (getenv("UMP_ALLOC_HOST_RETAIN") == NULL) {
            CHECK(t >= 40 * MiB, "ump_trim() after freeing 40 MiB gave back only %zu bytes", t);
        }
        size_t t2 = ump_trim();
        CHECK(t2 == 0, "second ump_trim() gave back %zu bytes", t2);
        /* Still usable after trim (small and large). */
        void *a = ump_malloc(100), *b = ump_malloc(40 * MiB);
        CHECK(a != NULL && b != NULL, "allocation after ump_trim failed");
        if (a) memset(a, 1, 100);
        if (b) memset(b, 2, 40 * MiB);
        if (b) {
            struct ump_identity id;
            CHECK(identify(b, &id) == UMP_OK && id.ours && id.block_size == 40 * MiB,
                  "identify after trim failed");
        }
        ump_free(a, 100);
        ump_free(b, 40 * MiB);
        (void)ump_trim();
    }
}

/* ---- ump_config_var ------------------------------------------------------------------- */

static void test_config_var(void) {
    const char *name, *dflt, *help;
    size_t i, rows = 0;
    int have_align = 0, have_mode = 0, have_limit = 0, have_retain = 0;
    uint64_t e0 = ump_error_count();

    for (i = 0; i < 1000; i++) {
        name = dflt = help = NULL;
        int rc = ump_config_var(i, &name, &dflt, &help);
        if (rc == UMP_ERR_INVALID) break;
        CHECK(rc == UMP_OK, "ump_config_var(%zu) = %d", i, rc);
        if (rc != UMP_OK) break;
        rows++;
        CHECK(name != NULL && strncmp(name, "UMP_ALLOC", 9) == 0,
              "ump_config_var(%zu): name \"%s\" does not start with UMP_ALLOC", i,
              name ? name : "NULL");
        CHECK(dflt != NULL && dflt[0] != '\0', "ump_config_var(%zu): empty default", i);
        CHECK(help != NULL && help[0] != '\0', "ump_config_var(%zu): empty help", i);
        if (!name || !dflt) continue;
        size_t j;
        for (j = 0; j < i; j++) {
            const char *n2 = NULL, *d2 = NULL, *h2 = NULL;
            if (ump_config_var(j, &n2, &d2, &h2) == UMP_OK && n2)
                CHECK(strcmp(n2, name) != 0, "ump_config_var: %s listed twice", name);
        }
        if (strcmp(name, "UMP_ALLOC_ALIGNMENT") == 0) {
            have_align = 1;
            CHECK(strcmp(dflt, "512") == 0, "UMP_ALLOC_ALIGNMENT default \"%s\"", dflt);
        } else if (strcmp(name, "UMP_ALLOC_MODE") == 0) {
            have_mode = 1;
            CHECK(strcmp(dflt, "auto") == 0, "UMP_ALLOC_MODE default \"%s\"", dflt);
        } else if (strcmp(name, "UMP_ALLOC_LIMIT") == 0) {
            have_limit = 1;
        } else if (strcmp(name, "UMP_ALLOC_HOST_RETAIN") == 0) {
            have_retain = 1;
        }
    }
    CHECK(rows > 0 && rows < 1000, "ump_config_var: %zu rows", rows);
    CHECK(have_align && have_mode && have_limit && have_retain,
          "ump_config_var: missing a variable the library reads (align %d mode %d limit %d "
          "retain %d)",
          have_align, have_mode, have_limit, have_retain);
    /* The row past the end ends the loop: not counted as an error (a listing per call of
       config_table() would otherwise show up in ump_stats' error totals). */
    CHECK(ump_error_count() == e0, "listing the config table counted %" PRIu64
          " errors, want 0", ump_error_count() - e0);

    /* Past the end: UMP_ERR_INVALID, outputs untouched. */
    const char *sentinel = "sentinel";
    size_t bad_idx[] = {rows, rows + 1, SIZE_MAX};
    for (i = 0; i < 3; i++) {
        name = dflt = help = sentinel;
        ump_clear_error();
        int rc = ump_config_var(bad_idx[i], &name, &dflt, &help);
        CHECK(rc == UMP_ERR_INVALID, "ump_config_var(%zu) past the end = %d", bad_idx[i], rc);
        CHECK(name == sentinel && dflt == sentinel && help == sentinel,
              "ump_config_var(%zu) wrote outputs on failure", bad_idx[i]);
        CHECK(ump_last_error() != NULL, "ump_config_var(%zu): no last error", bad_idx[i]);
    }
    /* NULL out-pointers: UMP_ERR_NULL, the others untouched. */
    name = dflt = help = sentinel;
    int rc = ump_config_var(0, NULL, &dflt, &help);
    CHECK(rc == UMP_ERR_NULL && dflt == sentinel && help == sentinel,
          "ump_config_var(0, NULL, ..) = %d", rc);
    rc = ump_config_var(0, &name, NULL, &help);
    CHECK(rc == UMP_ERR_NULL && name == sentinel && help == sentinel,
          "ump_config_var(0, .., NULL, ..) = %d", rc);
    rc = ump_config_var(0, &name, &dflt, NULL);
    CHECK(rc == UMP_ERR_NULL && name == sentinel && dflt == sentinel,
          "ump_config_var(0, .., NULL) = %d", rc);
    rc = ump_config_var(0, NULL, NULL, NULL);
    CHECK(rc == UMP_ERR_NULL, "ump_config_var(0, NULL, NULL, NULL) = %d", rc);
}

/* What a value means, parsed as the configuration parses it (ump_config_describe). */
static void test_config_describe(void) {
    char out[128];
    uint64_t e0 = ump_error_count();
    int rc = ump_config_describe("UMP_ALLOC_LIMIT", "8GB", out, sizeof out);
    CHECK(rc == UMP_OK && strcmp(out, "8 GiB (8589934592 bytes)") == 0,
          "ump_config_describe(UMP_ALLOC_LIMIT, 8GB) = %d \"%s\"", rc, rc == UMP_OK ? out : "-");
    rc = ump_config_describe("UMP_ALLOC_MODE", " Managed ", out, sizeof out);
    CHECK(rc == UMP_OK && strcmp(out, "managed") == 0, "ump_config_describe(MODE) = %d \"%s\"",
          rc, rc == UMP_OK ? out : "-");
    /* An invalid value: the configuration's message, outputs untouched, not counted. */
    strcpy(out, "sentinel");
    ump_clear_error();
    rc = ump_config_describe("UMP_ALLOC_LIMIT", "64K", out, sizeof out);
    CHECK(rc == UMP_ERR_CONFIG, "ump_config_describe(UMP_ALLOC_LIMIT, 64K) = %d", rc);
    CHECK(strcmp(out, "sentinel") == 0, "ump_config_describe wrote its output on failure");
    CHECK(last_err_contains("UMP_ALLOC_LIMIT=\"64K\"") && last_err_contains("minimum"),
          "ump_config_describe(64K): last error %s", last_err_or("NULL"));
    CHECK(ump_error_count() == e0, "an invalid value described counted %" PRIu64 " errors",
          ump_error_count() - e0);
    /* Misuse: an unknown name, a buffer too small, NULL. */
    rc = ump_config_describe("UMP_ALLOC_MODEE", "host", out, sizeof out);
    CHECK(rc == UMP_ERR_INVALID && strcmp(out, "sentinel") == 0,
          "ump_config_describe(UMP_ALLOC_MODEE) = %d", rc);
    rc = ump_config_describe("UMP_ALLOC_LIMIT", "8G", out, 8);
    CHECK(rc == UMP_ERR_INVALID && strcmp(out, "sentinel") == 0,
          "ump_config_describe with 8 bytes of room = %d", rc);
    rc = ump_config_describe("UMP_ALLOC_LIMIT", "8G", out, 0);
    CHECK(rc == UMP_ERR_INVALID, "ump_config_describe with no room = %d", rc);
    CHECK(ump_config_describe(NULL, "8G", out, sizeof out) == UMP_ERR_NULL,
          "ump_config_describe(NULL name)");
    CHECK(ump_config_describe("UMP_ALLOC_LIMIT", NULL, out, sizeof out) == UMP_ERR_NULL,
          "ump_config_describe(NULL value)");
    CHECK(ump_config_describe("UMP_ALLOC_LIMIT", "8G", NULL, sizeof out) == UMP_ERR_NULL,
          "ump_config_describe(NULL out)");
    ump_clear_error();
}

/* One variable of the environment, read through its row (ump_config_setting). */
static void test_config_setting(void) {
    char out[64];
    uint64_t e0 = ump_error_count();
    unsetenv("UMP_ALLOC_TORCH_ROUTE");
    int rc = ump_config_setting("UMP_ALLOC_TORCH_ROUTE", out, sizeof out);
    CHECK(rc == UMP_OK && strcmp(out, "segments") == 0, "ump_config_setting(TORCH_ROUTE) unset = %d \"%s\"",
          rc, rc == UMP_OK ? out : "-");
    setenv("UMP_ALLOC_TORCH_ROUTE", " swap ", 1);
    rc = ump_config_setting("UMP_ALLOC_TORCH_ROUTE", out, sizeof out);
    CHECK(rc == UMP_OK && strcmp(out, "swap") == 0, "ump_config_setting(TORCH_ROUTE= swap ) = %d \"%s\"",
          rc, rc == UMP_OK ? out : "-");
    /* A refused value: the table's message, outputs untouched, not counted. */
    setenv("UMP_ALLOC_TORCH_ROUTE", "pluggable", 1);
    strcpy(out, "sentinel");
    ump_clear_error();
    rc = ump_config_setting("UMP_ALLOC_TORCH_ROUTE", out, sizeof out);
    CHECK(rc == UMP_ERR_CONFIG && strcmp(out, "sentinel") == 0, "ump_config_setting(pluggable) = %d", rc);
    CHECK(last_err_contains("UMP_ALLOC_TORCH_ROUTE=\"pluggable\"") && last_err_contains("segments or swap"),
          "ump_config_setting(pluggable): last error %s", last_err_or("NULL"));
    CHECK(ump_error_count() == e0, "a refused value read counted %" PRIu64 " errors", ump_error_count() - e0);
    unsetenv("UMP_ALLOC_TORCH_ROUTE");
    /* Misuse: an unknown name, a buffer too small, NULL. */
    rc = ump_config_setting("UMP_ALLOC_ROUTE", out, sizeof out);
    CHECK(rc == UMP_ERR_INVALID && strcmp(out, "sentinel") == 0, "ump_config_setting(UMP_ALLOC_ROUTE) = %d", rc);
    rc = ump_config_setting("UMP_ALLOC_TORCH_ROUTE", out, 8);
    CHECK(rc == UMP_ERR_INVALID && strcmp(out, "sentinel") == 0, "ump_config_setting with 8 bytes of room = %d", rc);
    CHECK(ump_config_setting(NULL, out, sizeof out) == UMP_ERR_NULL, "ump_config_setting(NULL name)");
    CHECK(ump_config_setting("UMP_ALLOC_TORCH_ROUTE", NULL, sizeof out) == UMP_ERR_NULL,
          "ump_config_setting(NULL out)");
    ump_clear_error();
}

/* ---- 8. CuPy and PyTorch entry points without a GPU ----------------------------------- */

/* ---- transfer plans: a view or a DMA copy (issue 22) ----------------------------------- */

static void test_transfer(void) {
    static const struct {
        int dir, mem, res, coherent;
        double touch;
        int path, view_possible;
    } rows[] = {
        {UMP_TO_HOST, UMP_MEMORY_MANAGED, UMP_RESIDENT_DEVICE, 0, 1.0, UMP_PATH_COPY, 1},
        {UMP_TO_HOST, UMP_MEMORY_MANAGED, UMP_RESIDENT_UNKNOWN, 0, 1.0, UMP_PATH_COPY, 1},
        {UMP_TO_HOST, UMP_MEMORY_MANAGED, UMP_RESIDENT_DEVICE, 0, 0.01, UMP_PATH_VIEW, 1},
        {UMP_TO_HOST, UMP_MEMORY_MANAGED, UMP_RESIDENT_HOST, 0, 1.0, UMP_PATH_VIEW, 1},
        {UMP_TO_HOST, UMP_MEMORY_MANAGED, UMP_RESIDENT_DEVICE, 1, 1.0, UMP_PATH_VIEW, 1},
        {UMP_TO_HOST, UMP_MEMORY_PINNED, UMP_RESIDENT_HOST, 0, 1.0, UMP_PATH_VIEW, 1},
        {UMP_TO_HOST, UMP_MEMORY_DEVICE, UMP_RESIDENT_DEVICE, 0, 0.01, UMP_PATH_COPY, 0},
        {UMP_TO_DEVICE, UMP_MEMORY_PINNED, UMP_RESIDENT_HOST, 0, 1.0, UMP_PATH_COPY, 1},
        {UMP_TO_DEVICE, UMP_MEMORY_PINNED, UMP_RESIDENT_HOST, 0, 0.01, UMP_PATH_VIEW, 1},
        {UMP_TO_DEVICE, UMP_MEMORY_MANAGED, UMP_RESIDENT_HOST, 0, 1.0, UMP_PATH_VIEW, 1},
        {UMP_TO_DEVICE, UMP_MEMORY_PAGEABLE, UMP_RESIDENT_HOST, 0, 0.01, UMP_PATH_COPY, 0},
        {UMP_TO_DEVICE, UMP_MEMORY_PAGEABLE, UMP_RESIDENT_HOST, 1, 1.0, UMP_PATH_VIEW, 1},
    };
    struct ump_transfer_facts f;
    struct ump_transfer_plan plan, poison;
    size_t i;
    memset(&poison, 0xA5, sizeof poison);
    for (i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        memset(&f, 0, sizeof f);
        f.size = (uint32_t)sizeof f;
        f.direction = rows[i].dir;
        f.memory = rows[i].mem;
        f.resident = rows[i].res;
        f.coherent = rows[i].coherent;
        f.bytes = (uint64_t)1 << 30;
        f.touch = rows[i].touch;
        plan = poison;
        plan.size = (uint32_t)sizeof plan;
        int rc = ump_decide_transfer(&f, &plan);
        CHECK(rc == UMP_OK, "ump_decide_transfer(row %zu) = %d (%s)", i, rc, last_err_or("-"));
        CHECK((int)plan.path == rows[i].path && plan.view_possible == (rows[i].view_possible != 0),
              "row %zu: path %d view_possible %d, want %d %d", i, (int)plan.path,
              plan.view_possible, rows[i].path, rows[i].view_possible);
        CHECK(plan.version == UMP_TRANSFER_VERSION && plan.size == sizeof plan,
              "row %zu: version %u size %u", i, plan.version, plan.size);
        CHECK(memchr(plan.reason, 0, sizeof plan.reason) != NULL && plan.reason[0] != 0,
              "row %zu: reason is not a non-empty string", i);
    }
    /* Bad facts are refused and nothing is written. */
    memset(&f, 0, sizeof f);
    f.touch = 1.0;
    f.direction = 7;
    plan = poison;
    plan.size = (uint32_t)sizeof plan;
    CHECK(ump_decide_transfer(&f, &plan) == UMP_ERR_INVALID && last_err_contains("direction"),
          "direction 7: %s", last_err_or("-"));
    CHECK(plan.path == poison.path && plan.reason[0] == poison.reason[0], "plan written on failure");
    f.direction = UMP_TO_HOST;
    f.touch = 0.0 / 0.0;
    CHECK(ump_decide_transfer(&f, &plan) == UMP_ERR_INVALID && last_err_contains("touch"),
          "touch NaN: %s", last_err_or("-"));
    f.touch = 1.0;
    f.coherent = 2;
    CHECK(ump_decide_transfer(&f, &plan) == UMP_ERR_INVALID, "coherent 2 must be refused");
    CHECK(ump_decide_transfer(NULL, &plan) == UMP_ERR_NULL, "NULL facts");

    /* Plans of addresses: our host memory is read by the host where it is; a GPU cannot read
     * it here (no GPU), so to a device it is only a copy. */
    unsigned char *p = (unsigned char *)ump_malloc(MiB);
    CHECK(p != NULL, "ump_malloc(1 MiB) for the transfer plan");
    if (p == NULL) return;
    memset(&f, 0xA5, sizeof f);
    f.size = (uint32_t)sizeof f;
    plan = poison;
    plan.size = (uint32_t)sizeof plan;
    int rc = ump_plan_transfer(p + 100, 4096, UMP_TO_HOST, -1, 1.0, &f, &plan);
    CHECK(rc == UMP_OK && plan.path == UMP_PATH_VIEW && plan.view_possible,
          "plan to the host of host memory: rc %d path %d (%s)", rc, (int)plan.path,
          last_err_or("-"));
    CHECK(f.bytes == 4096 && f.direction == UMP_TO_HOST && f.resident == UMP_RESIDENT_HOST &&
              f.memory == UMP_MEMORY_PAGEABLE && f.touch == 1.0 && f.coherent == 0,
          "facts: bytes %" PRIu64 " dir %d resident %d memory %d", f.bytes, f.direction,
          f.resident, f.memory);
    rc = ump_plan_transfer(p, 4096, UMP_TO_DEVICE, 0, 1.0, NULL, &plan);
    CHECK(rc == UMP_OK && plan.path == UMP_PATH_COPY && !plan.view_possible,
          "plan to a device without a GPU: rc %d path %d possible %d", rc, (int)plan.path,
          plan.view_possible);
    CHECK(ump_plan_transfer(p, 2 * MiB, UMP_TO_HOST, -1, 1.0, NULL, &plan) == UMP_ERR_INVALID &&
              last_err_contains("past the end"),
          "a range past its block: %s", last_err_or("-"));
    CHECK(ump_plan_transfer(p, 16, UMP_TO_HOST, -1, 1.0, NULL, NULL) == UMP_ERR_NULL, "NULL plan");
    CHECK(ump_plan_transfer(NULL, 16, UMP_TO_HOST, -1, 1.0, NULL, &plan) == UMP_ERR_NULL,
          "NULL ptr");
    CHECK(ump_plan_transfer(p, 16, 9, -1, 1.0, NULL, &plan) == UMP_ERR_INVALID, "direction 9");

    /* Hinted access: validated like the plain calls; no GPU, so host access only checks. */
    CHECK(ump_host_access(p, MiB, NULL) == UMP_OK, "ump_host_access: %s", last_err_or("-"));
    CHECK(ump_host_access_ex(p, MiB, NULL, 0.01) == UMP_OK, "ump_host_access_ex: %s",
          last_err_or("-"));
    CHECK(ump_host_access_ex(p, MiB, NULL, -1.0) == UMP_ERR_INVALID, "host access touch -1");
    CHECK(ump_host_access_ex(NULL, 8, NULL, 1.0) == UMP_ERR_NULL, "host access NULL");
    CHECK(ump_device_access_ex(p, MiB, 0, NULL, 1.0) == UMP_ERR_UNSUPPORTED,
          "device access without a GPU");
    CHECK(ump_device_access_ex(p, MiB, 0, NULL, 0.0 / 0.0) == UMP_ERR_INVALID,
          "device access touch NaN");
    ump_free(p, MiB);
}

static void test_gpu_entry_points(void) {
    uint64_t e0 = ump_error_count();
    ump_clear_error();
    void *p = ump_cupy_malloc(NULL, 1024, 0);
    CHECK(p == NULL, "ump_cupy_malloc on a GPU-less host returned %p", p);
    CHECK(last_err_contains("host") || last_err_contains("GPU"),
          "ump_cupy_malloc: last error %s (want 'host' or 'GPU')", last_err_or("NULL"));
    CHECK(ump_error_count() == e0 + 1, "ump_cupy_malloc: error count +%" PRIu64,
          ump_error_count() - e0);
    if (p) ump_cupy_free(NULL, p, 0);

    ump_clear_error();
    e0 = ump_error_count();
    p = ump_torch_malloc(1024, 0, NULL);
    CHECK(p == NULL, "ump_torch_malloc on a GPU-less host returned %p", p);
    CHECK(last_err_contains("host") || last_err_contains("GPU"),
          "ump_torch_malloc: last error %s (want 'host' or 'GPU')", last_err_or("NULL"));
    CHECK(ump_error_count() == e0 + 1, "ump_torch_malloc: error count +%" PRIu64,
          ump_error_count() - e0);
    if (p) ump_torch_free(p, 1024, 0, NULL);

    /* Other devices and sizes fail the same way. */
    p = ump_cupy_malloc((void *)&e0, 0, 3);
    CHECK(p == NULL, "ump_cupy_malloc(size 0, device 3) returned %p", p);
    p = ump_torch_malloc(100 * MiB, -1, (void *)&e0);
    CHECK(p == NULL, "ump_torch_malloc(100 MiB, device -1) returned %p", p);

    /* The CuPy fast path's param without its Python set-up: a defined error, no call into
     * Python; and the set-up itself refuses NULL functions. The torch hook entry points
     * refuse what is not a live block. */
    ump_clear_error();
    e0 = ump_error_count();
    p = ump_cupy_malloc((void *)(intptr_t)UMP_CUPY_CURRENT_STREAM, 1024, 0);
    CHECK(p == NULL && last_err_contains("ump_cupy_fast_path_init"),
          "ump_cupy_malloc(UMP_CUPY_CURRENT_STREAM) before set-up: %p, %s", p, last_err_or("NULL"));
    CHECK(ump_error_count() == e0 + 1, "fast-path param before set-up: error count +%" PRIu64,
          ump_error_count() - e0);
    ump_cupy_free((void *)(intptr_t)UMP_CUPY_CURRENT_STREAM, NULL, 0);
    CHECK(ump_cupy_fast_path_init(NULL, NULL, NULL, NULL, NULL, NULL) == UMP_ERR_INVALID,
          "ump_cupy_fast_path_init(NULL...) must be refused");
    /* Only one of the direct allocator's pair: refused before anything is kept (the
     * addresses are never called). */
    CHECK(ump_cupy_fast_path_init(&e0, &e0, &e0, &e0, NULL, &e0) == UMP_ERR_INVALID &&
              last_err_contains("ump_cupy_fast_path_init"),
          "ump_cupy_fast_path_init with half the direct pair must be refused");
    p = ump_cupy_malloc((void *)(intptr_t)UMP_CUPY_CURRENT_STREAM, 1024, 0);
    CHECK(p == NULL && last_err_contains("ump_cupy_fast_path_init"),
          "a refused set-up must leave the fast path unset: %p", p);
    CHECK(ump_torch_record_stream(NULL, NULL) == UMP_ERR_INVALID, "record_stream(NULL)");
    CHECK(ump_torch_record_stream(&e0, NULL) != UMP_OK, "record_stream(foreign)");
    CHECK(ump_torch_set_memory_fraction(1.5, 0) == UMP_ERR_INVALID, "fraction 1.5");
    CHECK(ump_torch_set_memory_fraction(0.0 / 0.0, 0) == UMP_ERR_INVALID, "fraction NaN");
    CHECK(ump_torch_empty_cache() == 0, "empty_cache without a GPU gives back nothing");
    CHECK(ump_torch_attach(NULL, NULL) == UMP_ERR_NULL, "attach(NULL)");
    {
        size_t fr = 7, tot = 9;
        CHECK(ump_device_memory_info(0, &fr, &tot) != UMP_OK && fr == 7 && tot == 9,
              "ump_device_memory_info without a GPU must fail and leave outputs alone");
        CHECK(ump_device_memory_info(0, NULL, &tot) == UMP_ERR_NULL, "memory info NULL output");
    }

    /* NULL frees are no-ops. */
    e0 = ump_error_count();
    ump_cupy_free(NULL, NULL, 0);
    ump_torch_free(NULL, 0, 0, NULL);
    ump_torch_free(NULL, 123, 5, (void *)&e0);
    CHECK(ump_error_count() == e0, "NULL cupy/torch frees counted errors");

    /* Foreign pointers through them: counted, no crash. */
    unsigned char *f = (unsigned char *)malloc(32);
    unsigned char st[32];
    if (f) memset(f, 0x42, 32);
    memset(st, 0x43, sizeof st);
    ump_clear_error();
    e0 = ump_error_count();
    ump_cupy_free(NULL, f, 0);
    CHECK(ump_error_count() == e0 + 1, "ump_cupy_free(libc pointer): error count +%" PRIu64,
          ump_error_count() - e0);
    CHECK(ump_last_error() != NULL, "ump_cupy_free(libc pointer): no last error");
    ump_clear_error();
    ump_torch_free(st, sizeof st, 0, NULL);
    CHECK(ump_error_count() == e0 + 2, "ump_torch_free(stack): error count +%" PRIu64,
          ump_error_count() - e0 - 1);
    CHECK(ump_last_error() != NULL, "ump_torch_free(stack): no last error");
    ump_torch_free(f, 32, 0, NULL);
    ump_cupy_free(NULL, st, 0);
    CHECK(ump_error_count() == e0 + 4, "foreign cupy/torch frees: error count +%" PRIu64
          ", want +4", ump_error_count() - e0);
    CHECK(f == NULL || first_not(f, 32, 0x42) == SIZE_MAX, "foreign free changed the block");
    CHECK(first_not(st, sizeof st, 0x43) == SIZE_MAX, "foreign free changed the stack buffer");
    free(f);

    /* Double free of one of our blocks through the GPU entry points is counted. */
    void *q = ump_malloc(256);
    if (q) {
        ump_free(q, 256);
        e0 = ump_error_count();
        ump_cupy_free(NULL, q, 0);
        ump_torch_free(q, 256, 0, NULL);
        CHECK(ump_error_count() == e0 + 2, "double frees via cupy/torch: +%" PRIu64 ", want +2",
              ump_error_count() - e0);
    }
}

/* ---- 9. multi-threaded churn ---------------------------------------------------------- */

#define NTHREADS 16
#define MAXLIVE 64

struct churn_arg {
    int tid;
    long iters;
    int identify;
    long failures;
    long identified;
};

struct live_block {
    unsigned char *p;
    size_t n;
    uint64_t seed;
};

static unsigned char tag_byte(int tid, uint64_t seed, size_t off) {
    return (unsigned char)((unsigned)tid * 16u + 1u + (unsigned)((seed + off * 7u) & 0xFF));
}

static void tag_write(unsigned char *p, size_t n, int tid, uint64_t seed) {
    size_t k = n < 8 ? n : 8, i;
    for (i = 0; i < k; i++) p[i] = tag_byte(tid, seed, i);
    for (i = n - k; i < n; i++) p[i] = tag_byte(tid, seed, i);
}

static int tag_ok(const unsigned char *p, size_t n, int tid, uint64_t seed) {
    size_t k = n < 8 ? n : 8, i;
    for (i = 0; i < k; i++)
        if (p[i] != tag_byte(tid, seed, i)) return 0;
    for (i = n - k; i < n; i++)
        if (p[i] != tag_byte(tid, seed, i)) return 0;
    return 1;
}

static void churn_release(struct churn_arg *a, struct live_block *b) {
    if (!tag_ok(b->p, b->n, a->tid, b->seed)) {
        if (a->failures++ < 5)
            CHECK(0, "thread %d: %zu-byte block %p lost its pattern (another thread wrote it?)",
                  a->tid, b->n, (void *)b->p);
    }
    ump_free(b->p, b->n);
}

static void *churn(void *argp) {
    struct churn_arg *a = (struct churn_arg *)argp;
    struct live_block live[MAXLIVE];
    int nlive = 0;
    uint64_t rng = UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)(a->tid + 1) * 0x1234567ULL;
    long it;

    if (ump_last_error() != NULL) {
        a->failures++;
        CHECK(0, "thread %d: a fresh thread sees a last error: %s", a->tid, ump_last_error());
    }
    for (it = 0; it < a->iters; it++) {
        uint64_t r = xorshift(&rng);
        /* Free one when full, or at random half of the time. */
        if (nlive == MAXLIVE || (nlive > 0 && (r & 1))) {
            int k = (int)((r >> 1) % (uint64_t)nlive);
            churn_release(a, &live[k]);
            live[k] = live[--nlive];
            continue;
        }
        size_t n;
        if (((r >> 8) & 63) == 0)
            n = 100 * 1000 + (size_t)((r >> 16) % (2 * MiB - 100 * 1000 + 1));
        else
            n = 1 + (size_t)((r >> 16) % 4096);
        unsigned char *p = (unsigned char *)ump_malloc(n);
        if (p == NULL) {
            if (a->failures++ < 5)
                CHECK(0, "thread %d: ump_malloc(%zu) returned NULL: %s", a->tid, n,
                      last_err_or("-"));
            continue;
        }
        if (!is_aligned(p, want_align(n))) {
            if (a->failures++ < 5)
                CHECK(0, "thread %d: ump_malloc(%zu) = %p not aligned", a->tid, n, (void *)p);
        }
        uint64_t seed = xorshift(&rng);
        tag_write(p, n, a->tid, seed);
        live[nlive].p = p;
        live[nlive].n = n;
        live[nlive].seed = seed;
        nlive++;
        if (a->identify && (it % 64) == 0) {
            int j;
            for (j = 0; j < nlive; j++) {
                struct ump_identity id;
                const unsigned char *at = live[j].p + (live[j].n - 1) / 2;
                int rc = identify(at, &id);
                a->identified++;
                if (rc != UMP_OK || !id.ours || id.base != (size_t)(uintptr_t)live[j].p ||
                    id.block_size != live[j].n || id.kind != UMP_KIND_HOST) {
                    if (a->failures++ < 5)
                        CHECK(0,
                              "thread %d: ump_identify(live %zu-byte block %p) rc %d ours %d "
                              "base %#zx size %zu kind %d",
                              a->tid, live[j].n, (void *)live[j].p, rc, id.ours, id.base,
                              id.block_size, (int)id.kind);
                }
            }
        }
    }
    while (nlive > 0) {
        churn_release(a, &live[nlive - 1]);
        nlive--;
    }
    return NULL;
}

/* Blocks made on one thread and freed on another (NumPy arrays travel between threads). */
#define XT_THREADS 4
#define XT_BLOCKS 2000

struct xt_arg {
    int tid;
    int count;
    struct live_block blocks[XT_BLOCKS];
};

static void *xt_producer(void *argp) {
    struct xt_arg *a = (struct xt_arg *)argp;
    uint64_t rng = 0xABCDEF12345ULL * (uint64_t)(a->tid + 7);
    int i;
    a->count = 0;
    for (i = 0; i < XT_BLOCKS; i++) {
        uint64_t r = xorshift(&rng);
        size_t n = (i % 100 == 0) ? 300000 + (size_t)(r % 100000) : 1 + (size_t)(r % 3000);
        unsigned char *p = (unsigned char *)ump_malloc(n);
        if (!p) continue;
        uint64_t seed = xorshift(&rng);
        tag_write(p, n, 100 + a->tid, seed);
        a->blocks[a->count].p = p;
        a->blocks[a->count].n = n;
        a->blocks[a->count].seed = seed;
        a->count++;
    }
    return NULL;
}

static void test_cross_thread_free(void) {
    static struct xt_arg args[XT_THREADS];
    pthread_t th[XT_THREADS];
    int i, j, started[XT_THREADS];
    uint64_t e0 = ump_error_count();
    for (i = 0; i < XT_THREADS; i++) {
        args[i].tid = i;
        started[i] = pthread_create(&th[i], NULL, xt_producer, &args[i]) == 0;
        CHECK(started[i], "pthread_create (producer %d) failed", i);
    }
    long bad = 0, total = 0;
    for (i = 0; i < XT_THREADS; i++) {
        if (!started[i]) continue;
        pthread_join(th[i], NULL);
        CHECK(args[i].count == XT_BLOCKS, "producer %d made %d of %d blocks", i, args[i].count,
              XT_BLOCKS);
    }
    /* Free on this thread, in an order that interleaves the producers. */
    for (j = 0; j < XT_BLOCKS; j++) {
        for (i = 0; i < XT_THREADS; i++) {
            if (!started[i] || j >= args[i].count) continue;
            struct live_block *b = &args[i].blocks[j];
            if (!tag_ok(b->p, b->n, 100 + i, b->seed)) bad++;
            ump_free(b->p, b->n);
            total++;
        }
    }
    CHECK(bad == 0, "cross-thread: %ld of %ld blocks lost their pattern", bad, total);
    CHECK(ump_error_count() == e0, "cross-thread frees counted %" PRIu64 " errors: %s",
          ump_error_count() - e0, last_err_or("-"));
}

/* Thread exit gives a thread's cached free slots back to the pool.
 *
 * Observed through ump_trim(): when every block is free and every slot is back in its class,
 * the slabs' arena chunk is wholly free and ump_trim() gives it back (> 0 bytes). Slots kept
 * by a dead thread pin their slabs, and ump_trim() gives back nothing.
 *
 * Two ways a thread frees: in its body, and in a pthread-key (thread-specific data)
 * destructor, which glibc runs after the thread's C++/Rust thread_local destructors; a thread
 * that first touches the allocator there must still not lose the slots it frees. */
#define XF_BLOCKS 40
#define XF_SIZE ((size_t)200000)

static void *xf_blocks[XF_BLOCKS];
static pthread_key_t xf_key;

static void *xf_body_frees(void *unused) {
    int i;
    (void)unused;
    for (i = 0; i < XF_BLOCKS; i++) {
        xf_blocks[i] = ump_malloc(XF_SIZE);
        if (xf_blocks[i]) memset(xf_blocks[i], 0x5C, XF_SIZE);
    }
    for (i = 0; i < XF_BLOCKS; i++) ump_free(xf_blocks[i], XF_SIZE);
    return NULL;
}

static void xf_key_destructor(void *v) {
    void **blocks = (void **)v;
    int i;
    for (i = 0; i < XF_BLOCKS; i++) ump_free(blocks[i], XF_SIZE);
}

static void *xf_key_frees(void *blocks) {
    /* This thread never calls the allocator itself: the frees happen in the destructor. */
    pthread_setspecific(xf_key, blocks);
    return NULL;
}

static void test_thread_exit_flush(void) {
    pthread_t t;
    int i;
    uint64_t e0 = ump_error_count();

    (void)ump_trim();
    size_t base = ump_trim();
    CHECK(base == 0, "ump_trim() right after ump_trim() gave back %zu bytes", base);

    /* 1. Allocate and free in the thread body. */
    if (pthread_create(&t, NULL, xf_body_frees, NULL) == 0) {
        pthread_join(t, NULL);
        size_t got = ump_trim();
        CHECK(got > 0,
              "after a thread allocated and freed %d x %zu bytes and exited, ump_trim() gave "
              "back 0 bytes: the exited thread's cached slots were not returned",
              XF_BLOCKS, XF_SIZE);
    } else {
        CHECK(0, "pthread_create failed");
    }

    /* 2. Free in a pthread-key destructor of a thread that never used the allocator. */
    CHECK(pthread_key_create(&xf_key, xf_key_destructor) == 0, "pthread_key_create failed");
    for (i = 0; i < XF_BLOCKS; i++) {
        xf_blocks[i] = ump_malloc(XF_SIZE);
        CHECK(xf_blocks[i] != NULL, "ump_malloc(%zu) failed", XF_SIZE);
        if (xf_blocks[i]) memset(xf_blocks[i], 0x5D, XF_SIZE);
    }
    (void)ump_trim(); /* flushes this thread's cache; the blocks stay live */
    if (pthread_create(&t, NULL, xf_key_frees, xf_blocks) == 0) {
        pthread_join(t, NULL); /* the key destructor has run when join returns */
        struct ump_identity id;
        CHECK(identify(xf_blocks[0], &id) == UMP_OK && !id.ours,
              "a block freed in a pthread-key destructor is still live");
        size_t got = ump_trim();
        CHECK(got > 0,
              "after a thread freed %d x %zu bytes in a pthread-key destructor (its first use "
              "of the allocator) and exited, ump_trim() gave back 0 bytes: the freed slots "
              "went into a per-thread cache that is never flushed (memory pinned for good)",
              XF_BLOCKS, XF_SIZE);
    } else {
        CHECK(0, "pthread_create failed");
    }
    pthread_key_delete(xf_key);
    CHECK(ump_error_count() == e0, "thread-exit tests counted %" PRIu64 " errors: %s",
          ump_error_count() - e0, last_err_or("-"));
}

/* Calls ump_trim() (torch.cuda.empty_cache / cupy free_all_blocks) while others allocate. */
static atomic_int g_churn_done;
static atomic_long g_trims;

static void *trimmer(void *unused) {
    (void)unused;
    while (!atomic_load(&g_churn_done)) {
        (void)ump_trim();
        atomic_fetch_add(&g_trims, 1);
        struct timespec ts = {0, 2 * 1000 * 1000}; /* 2 ms */
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void test_threads(void) {
    pthread_t th[NTHREADS], trim_th;
    struct churn_arg args[NTHREADS];
    int started[NTHREADS];
    long iters = g_quick ? 20000 : 200000;
    int i;
    uint64_t e0 = ump_error_count();
    const char *env = getenv("UMP_TEST_CHURN_ITERS");
    if (env && *env) iters = atol(env);

    atomic_store(&g_churn_done, 0);
    int trim_started = pthread_create(&trim_th, NULL, trimmer, NULL) == 0;
    CHECK(trim_started, "pthread_create (trimmer) failed");
    for (i = 0; i < NTHREADS; i++) {
        args[i].tid = i;
        args[i].iters = iters;
        args[i].identify = (i == 0);
        args[i].failures = 0;
        args[i].identified = 0;
        int rc = pthread_create(&th[i], NULL, churn, &args[i]);
        started[i] = rc == 0;
        CHECK(rc == 0, "pthread_create %d failed: %d", i, rc);
    }
    long failures = 0, identified = 0;
    for (i = 0; i < NTHREADS; i++) {
        if (!started[i]) continue;
        pthread_join(th[i], NULL);
        failures += args[i].failures;
        identified += args[i].identified;
    }
    atomic_store(&g_churn_done, 1);
    if (trim_started) pthread_join(trim_th, NULL);
    CHECK(failures == 0, "thread churn: %ld failures", failures);
    CHECK(identified > 0, "thread churn: the identify thread identified nothing");
    CHECK(ump_error_count() == e0, "thread churn counted %" PRIu64 " library errors: %s",
          ump_error_count() - e0, last_err_or("-"));
    fprintf(stderr, "note: churn %d threads x %ld iterations, %ld identify calls, %ld trims\n",
            NTHREADS, iters, identified, atomic_load(&g_trims));
    test_cross_thread_free();
    test_thread_exit_flush();
    /* Everything was freed; the allocator still works. */
    void *p = ump_malloc(12345);
    CHECK(p != NULL, "ump_malloc after churn failed");
    ump_free(p, 12345);
    (void)ump_trim();
}

/* ---- 10. bad configuration ------------------------------------------------------------ */

static void test_bad_config(void) {
    const char *env = getenv("UMP_ALLOC_ALIGNMENT");
    CHECK(env != NULL, "--bad-config needs UMP_ALLOC_ALIGNMENT set to an invalid value");
    CHECK(ump_alignment() == 0, "ump_alignment() with a bad UMP_ALLOC_ALIGNMENT = %zu",
          ump_alignment());
    CHECK(ump_current_mode() == UMP_MODE_UNSET, "mode %d before a failed init",
          (int)ump_current_mode());

    struct ump_capabilities caps;
    memset(&caps, 0, sizeof caps);
    caps.size = (uint32_t)sizeof caps;
    int rc = ump_capabilities(&caps);
    CHECK(rc == UMP_OK, "ump_capabilities with a bad config = %d", rc);
    CHECK(caps.mode == UMP_MODE_UNSET && !caps.mode_fixed,
          "ump_capabilities with a bad config: mode %d fixed %d", (int)caps.mode,
          caps.mode_fixed);
    CHECK(strstr(caps.mode_reason, "UMP_ALLOC_ALIGNMENT") != NULL,
          "ump_capabilities mode_reason \"%s\" does not name UMP_ALLOC_ALIGNMENT",
          caps.mode_reason);

    rc = ump_config_check();
    CHECK(rc == UMP_ERR_CONFIG && last_err_contains("UMP_ALLOC_ALIGNMENT"),
          "ump_config_check() with a bad config = %d (%s)", rc, last_err_or("NULL"));

    uint64_t e0 = ump_error_count();
    ump_clear_error();
    rc = ump_init();
    CHECK(rc == UMP_ERR_CONFIG, "ump_init() with UMP_ALLOC_ALIGNMENT=%s = %d want UMP_ERR_CONFIG",
          env ? env : "?", rc);
    CHECK(last_err_contains("UMP_ALLOC_ALIGNMENT"), "ump_init: last error %s",
          last_err_or("NULL"));
    CHECK(ump_error_count() == e0 + 1, "failed ump_init: error count +%" PRIu64,
          ump_error_count() - e0);

    ump_clear_error();
    errno = 0;
    void *p = ump_malloc(10);
    int err = errno;
    CHECK(p == NULL, "ump_malloc(10) with a bad config returned %p", p);
    CHECK(err == ENOMEM, "ump_malloc with a bad config: errno %d want ENOMEM", err);
    CHECK(last_err_contains("UMP_ALLOC_ALIGNMENT"), "ump_malloc: last error %s",
          last_err_or("NULL"));
    if (p) ump_free(p, 10);

    errno = 0;
    p = ump_calloc(2, 5);
    CHECK(p == NULL && errno == ENOMEM, "ump_calloc with a bad config = %p errno %d", p, errno);
    errno = 0;
    p = ump_realloc(NULL, 10);
    CHECK(p == NULL && errno == ENOMEM, "ump_realloc(NULL) with a bad config = %p", p);
    p = ump_cupy_malloc(NULL, 10, 0);
    CHECK(p == NULL, "ump_cupy_malloc with a bad config = %p", p);
    p = ump_torch_malloc(10, 0, NULL);
    CHECK(p == NULL, "ump_torch_malloc with a bad config = %p", p);
    CHECK(ump_init() == UMP_ERR_CONFIG, "second ump_init() with a bad config succeeded");
    CHECK(ump_current_mode() == UMP_MODE_UNSET, "mode fixed despite a bad config");

    /* Frees and queries stay safe. */
    e0 = ump_error_count();
    ump_free(NULL, 0);
    ump_cupy_free(NULL, NULL, 0);
    ump_torch_free(NULL, 0, 0, NULL);
    CHECK(ump_error_count() == e0, "NULL frees with a bad config counted errors");
    int x = 0;
    ump_free(&x, sizeof x);
    CHECK(ump_error_count() == e0 + 1, "foreign free with a bad config: +%" PRIu64,
          ump_error_count() - e0);
    struct ump_identity id;
    CHECK(identify(&x, &id) == UMP_OK && !id.ours && id.kind == UMP_KIND_FOREIGN_HOST,
          "ump_identify with a bad config");
    CHECK(ump_trim() == 0, "ump_trim with a bad config gave something back");
    CHECK(ump_version() != NULL && ump_version()[0] != '\0', "ump_version with a bad config");
    test_config_var();
    ump_clear_error();
    CHECK(ump_last_error() == NULL, "ump_clear_error with a bad config");
}

/* ---- main ----------------------------------------------------------------------------- */

/* 5 (issue 5): statistics, scopes. */
static void test_stats_and_scopes(void) {
    struct ump_stats a, b;
    CHECK(ump_stats(NULL) == UMP_ERR_NULL, "ump_stats(NULL) must be UMP_ERR_NULL");
    struct ump_stats tiny;
    memset(&tiny, 0x5A, sizeof tiny);
    tiny.size = 4;
    CHECK(ump_stats(&tiny) == UMP_ERR_INVALID && tiny.size == 4 && tiny.version == 0x5A5A5A5Au,
          "ump_stats with size 4 must fail and write nothing");
    /* An old caller that knows only the first 40 bytes gets exactly those. */
    unsigned char part[sizeof(struct ump_stats)];
    memset(part, 0xCD, sizeof part);
    uint32_t want = 40;
    memcpy(part, &want, 4);
    CHECK(ump_stats((struct ump_stats *)part) == UMP_OK && part[40] == 0xCD && part[39] != 0xCD - 1,
          "ump_stats wrote past the caller's size");

    stats_now(&a);
    CHECK(a.mode != UMP_MODE_UNSET && a.host_kind != UMP_KIND_UNKNOWN, "stats: mode %d host kind %d",
          (int)a.mode, (int)a.host_kind);
    void *p = ump_malloc(3 * MiB + 5);
    void *q = ump_malloc(100);
    CHECK(p != NULL && q != NULL, "malloc for stats");
    stats_now(&b);
    CHECK(b.host.in_use == a.host.in_use + 3 * MiB + 5 + 100,
          "stats: in_use %" PRIu64 " -> %" PRIu64 " after 3 MiB + 105 bytes", a.host.in_use,
          b.host.in_use);
    CHECK(b.host.in_use_peak >= b.host.in_use && b.host.mapped >= b.host.in_use &&
              b.host.mapped_peak >= b.host.mapped,
          "stats: peaks below current values");
    CHECK(b.host.allocs >= a.host.allocs + 2, "stats: allocs %" PRIu64 " -> %" PRIu64,
          a.host.allocs, b.host.allocs);
    CHECK(b.total.in_use >= b.host.in_use && b.kinds[b.host_kind].in_use >= b.host.in_use,
          "stats: total/kind below the host side");
    ump_free(p, 3 * MiB + 5);
    ump_free(q, 100);
    stats_now(&a);
    CHECK(a.host.in_use == b.host.in_use - 3 * MiB - 105 && a.host.in_use_peak >= b.host.in_use,
          "stats after free: in_use %" PRIu64 " peak %" PRIu64, a.host.in_use, a.host.in_use_peak);
    CHECK(a.host.cached >= 3 * MiB, "stats: freed 3 MiB is not reported cached (%" PRIu64 ")",
          a.host.cached);
    CHECK(ump_reset_peak() == UMP_OK, "ump_reset_peak");
    stats_now(&b);
    CHECK(b.host.in_use_peak == b.host.in_use, "reset_peak: peak %" PRIu64 " != in_use %" PRIu64,
          b.host.in_use_peak, b.host.in_use);
    uint64_t e0 = b.errors;
    ump_free((void *)0x10, 1); /* not ours: counted */
    stats_now(&a);
    CHECK(a.errors == e0 + 1 && a.errors_invalid_free >= 1, "stats: errors %" PRIu64 " -> %" PRIu64,
          e0, a.errors);
    ump_clear_error();

    /* Scopes: unbalanced end, NULL, bad flags. */
    CHECK(ump_scope_depth() == 0, "scope depth at start");
    CHECK(ump_scope_end() == UMP_ERR_INVALID && last_err_contains("no scope"),
          "ump_scope_end without a scope: %s", last_err_or("?"));
    CHECK(ump_scope_begin_ex(0x80) == UMP_ERR_INVALID, "unknown scope flag accepted");
    CHECK(ump_scope_keep(NULL) == UMP_ERR_NULL, "ump_scope_keep(NULL)");
    ump_clear_error();

    /* 1000 iterations that never free: flat memory because the scope does. */
    stats_now(&a);
    uint64_t mapped_after_warmup = 0;
    void *kept = NULL;
    for (int it = 0; it < 1000; it++) {
        CHECK(ump_scope_begin() == UMP_OK, "ump_scope_begin");
        for (int k = 0; k < 6; k++) {
            void *x = ump_malloc(1000 + (size_t)k * 40000 + (size_t)(it % 13));
            CHECK(x != NULL, "malloc in scope");
            if (x) fill_pattern(x, 1000, (uint64_t)it * 7 + (uint64_t)k);
        }
        void *big = ump_calloc(5 * MiB, 1);
        CHECK(big != NULL, "calloc in scope");
        void *r = ump_realloc(ump_malloc(64), 300000);
        CHECK(r != NULL, "realloc in scope");
        if (it == 500) {
            kept = ump_malloc(777);
            CHECK(ump_scope_keep(kept) == UMP_OK, "ump_scope_keep");
        }
        if (it % 100 == 0) { /* a nested scope that is ended first */
            CHECK(ump_scope_begin() == UMP_OK && ump_scope_depth() == 2, "nested scope");
            void *n = ump_malloc(12345);
            struct ump_scope_report rep = {.size = sizeof rep};
            CHECK(ump_scope_end_ex(&rep) == UMP_OK && rep.allocs == 1 && rep.live_blocks == 1 &&
                      rep.live_bytes == 12345 && rep.freed,
                  "nested scope report: allocs %" PRIu64 " live %" PRIu64, rep.allocs,
                  rep.live_blocks);
            struct ump_identity nid;
            CHECK(identify(n, &nid) == UMP_OK && !nid.ours, "block of an ended scope still live");
        }
        struct ump_scope_report rep;
        memset(&rep, 0xEE, sizeof rep);
        rep.size = sizeof rep;
        CHECK(ump_scope_end_ex(&rep) == UMP_OK, "ump_scope_end_ex: %s", last_err_or("?"));
        /* malloc(64) then realloc: one block of the scope, moved. */
        CHECK(rep.allocs == 8 + (it == 500) && rep.live_blocks == 8 && rep.frees == 0 && rep.freed,
              "scope report it %d: allocs %" PRIu64 " live %" PRIu64 " frees %" PRIu64, it,
              rep.allocs, rep.live_blocks, rep.frees);
        if (it == 10) {
            struct ump_stats s;
            stats_now(&s);
            mapped_after_warmup = s.host.mapped;
        }
    }
    stats_now(&b);
    CHECK(b.host.in_use == a.host.in_use + 777,
          "scope loop leaked: in_use %" PRIu64 " -> %" PRIu64, a.host.in_use, b.host.in_use);
    CHECK(b.host.mapped == mapped_after_warmup,
          "scope loop: mapped grew from %" PRIu64 " to %" PRIu64, mapped_after_warmup, b.host.mapped);
    CHECK(b.scopes_open == 0 && ump_scope_depth() == 0, "scopes left open");
    struct ump_identity kid;
    CHECK(identify(kept, &kid) == UMP_OK && kid.ours && kid.block_size == 777,
          "a kept block must survive its scope");
    ump_free(kept, 777);

    /* Keep-live scopes report but never free; a block freed on another path leaves its scope. */
    CHECK(ump_scope_begin_ex(UMP_SCOPE_KEEP_LIVE) == UMP_OK, "keep-live scope");
    void *l1 = ump_malloc(4096), *l2 = ump_malloc(50);
    ump_free(l2, 50);
    struct ump_scope_report rep = {.size = sizeof rep};
    uint64_t e1 = ump_error_count();
    CHECK(ump_scope_end_ex(NULL) == UMP_ERR_NULL && ump_scope_depth() == 1,
          "ump_scope_end_ex(NULL) must fail and keep the scope open");
    CHECK(ump_scope_end_ex(&rep) == UMP_OK && !rep.freed && rep.live_blocks == 1 &&
              rep.live_bytes == 4096 && rep.frees == 1,
          "keep-live report: live %" PRIu64 " frees %" PRIu64, rep.live_blocks, rep.frees);
    struct ump_identity lid;
    CHECK(identify(l1, &lid) == UMP_OK && lid.ours, "keep-live scope freed a block");
    ump_free(l1, 4096);
    CHECK(ump_error_count() == e1 + 1, "scope tests counted %" PRIu64 " unexpected errors: %s",
          ump_error_count() - e1 - 1, last_err_or("(none)"));
    CHECK(a.errors == e1, "the scope loop counted %" PRIu64 " errors", e1 - a.errors);
    ump_clear_error();
}

int main(int argc, char **argv) {
    int bad_config = 0, i;
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--bad-config") == 0) {
            bad_config = 1;
        } else {
            fprintf(stderr, "usage: %s [--bad-config]\n", argv[0]);
            return 2;
        }
    }
    const char *q = getenv("UMP_TEST_QUICK");
    g_quick = q != NULL && *q != '\0' && strcmp(q, "0") != 0;

    if (bad_config) {
        test_bad_config();
    } else {
        const char *a = getenv("UMP_ALLOC_ALIGNMENT");
        if (a != NULL && *a != '\0') g_align = (size_t)strtoull(a, NULL, 10);
        fprintf(stderr, "note: expecting alignment %zu%s\n", g_align, g_quick ? " (quick)" : "");

        test_before_init();     /* 6, 7 (pre-init part) */
        test_init_and_config(); /* 7, 6 (post-init) */
        test_malloc();          /* 1 */
        test_calloc();          /* 2 */
        test_realloc();         /* 3 */
        test_free_errors();     /* 4 */
        test_identify();        /* 5 */
        test_config_var();
        test_config_describe();
        test_config_setting();
        test_stats_and_scopes();
        test_gpu_entry_points(); /* 8 */
        test_transfer();
        test_threads();         /* 9 */
    }

    unsigned long pass = atomic_load(&g_pass), fail = atomic_load(&g_fail);
    printf("C ABI: %lu passed, %lu failed\n", pass, fail);
    fflush(stdout);
    return fail > 0 ? 1 : 0;
}
