/* Byte patterns shared by the C tests: a block filled with `fill_pattern(p, n, seed)` reads back
 * through `check_pattern(p, n, seed)`, which returns the first wrong offset or SIZE_MAX. */
#ifndef UMP_TEST_PATTERNS_H
#define UMP_TEST_PATTERNS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return x;
}

static uint8_t pat_byte(uint64_t seed, size_t i) {
    return (uint8_t)(mix64(seed ^ (uint64_t)(i / 8)) >> (8 * (i % 8)));
}

static void fill_pattern(void *p, size_t n, uint64_t seed) {
    unsigned char *b = (unsigned char *)p;
    size_t words = n / 8, i;
    for (i = 0; i < words; i++) {
        uint64_t w = mix64(seed ^ (uint64_t)i);
        memcpy(b + 8 * i, &w, 8);
    }
    for (i = words * 8; i < n; i++) {
        b[i] = pat_byte(seed, i);
    }
}

static size_t check_pattern(const void *p, size_t n, uint64_t seed) {
    const unsigned char *b = (const unsigned char *)p;
    size_t words = n / 8, i;
    for (i = 0; i < words; i++) {
        uint64_t w = mix64(seed ^ (uint64_t)i), got;
        memcpy(&got, b + 8 * i, 8);
        if (got != w) {
            size_t k;
            for (k = 8 * i; k < 8 * i + 8; k++) {
                if (b[k] != pat_byte(seed, k)) return k;
            }
        }
    }
    for (i = words * 8; i < n; i++) {
        if (b[i] != pat_byte(seed, i)) return i;
    }
    return SIZE_MAX;
}

#endif
