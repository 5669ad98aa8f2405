/* What the fork tests (torture.c, race.c) share: a monotonic clock, a sleep that survives
 * signals, and MiB. */
#ifndef UMP_FORK_COMMON_H
#define UMP_FORK_COMMON_H

#include <errno.h>
#include <stddef.h>
#include <time.h>

#define MiB ((size_t)1 << 20)

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

#endif
