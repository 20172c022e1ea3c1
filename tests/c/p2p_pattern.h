/*
 * p2p_pattern.h - what the point-to-point tests (test_p2p.c, test_p2p_faults.c) share: the bytes
 * every message carries (a pattern of its index and a salt, checked byte by byte on arrival) and
 * the environment that turns single copy off (the messages go through the cells).
 */
#ifndef P2P_PATTERN_H
#define P2P_PATTERN_H

#include <stddef.h>
#include <stdint.h>

static const char *const no_cma[] = {"HBMCOLL_P2P_CMA=0", NULL};

static inline uint8_t pattern(size_t i, unsigned salt) { return (uint8_t)(i * 131u + salt * 7u + (i >> 12)); }

static inline void fill(uint8_t *b, size_t n, unsigned salt) {
  for (size_t i = 0; i < n; i++) b[i] = pattern(i, salt);
}

static inline int check(const uint8_t *b, size_t n, unsigned salt) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != pattern(i, salt)) return 0;
  return 1;
}

#endif /* P2P_PATTERN_H */
