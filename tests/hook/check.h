/* The check machinery of the hook tests (test_hook.c, test_segments.c): a failed check prints
 * where and why, and is counted; each program exits non-zero when `failures` is. */
#ifndef UMP_HOOK_CHECK_H
#define UMP_HOOK_CHECK_H

#include <stdio.h>

static int failures = 0;
#define CHECK(cond, ...)                                                                        \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fprintf(stderr, "\n");                                                              \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#endif
