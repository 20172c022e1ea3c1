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

/* One case of main()'s loop over `cma` (1: the receiver pulls with CMA, 0: through the cells) with
 * its environment `env` (harness.h's spawn_expect). */
#define P2P_RUN(label, P, fn, arg, victim)                                                          \
  do {                                                                                              \
    char name_[64];                                                                                 \
    snprintf(name_, sizeof name_, "%s (%s)", label, cma ? "pulled" : "cells");                     \
    if (CASE(name_)) spawn_expect(name_, P, 120, env, fn, arg, victim);                            \
  } while (0)

#endif /* P2P_PATTERN_H */
