/*
 * reduce_check.h - what the reduce kernel tests share (header-only): counted checks with
 * the last line "N passed, N failed", the dtype and op lists and the float16 / bfloat16
 * NaN tests. Used by test_reduce.c (against a scalar reference) and
 * test_reduce_cases.c (fixed cases, names, error returns).
 */
#ifndef HBMCOLL_TESTS_C_REDUCE_CHECK_H
#define HBMCOLL_TESTS_C_REDUCE_CHECK_H

#include <stdint.h>
#include <stdio.h>

#include "coll.h"

static unsigned long test_passed, test_failed;

/* Counts a check; prints the first 40 failures to stderr. */
#define CHECK(cond, ...)                                                                   \
  do {                                                                                     \
    if (cond) {                                                                            \
      test_passed++;                                                                       \
    } else {                                                                               \
      if (test_failed++ < 40) {                                                            \
        fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                               \
        fprintf(stderr, __VA_ARGS__);                                                      \
        fputc('\n', stderr);                                                               \
      }                                                                                    \
    }                                                                                      \
  } while (0)

static const coll_dtype_t all_dtypes[] = {COLL_INT8,    COLL_UINT8,    COLL_INT32,
                                          COLL_INT64,   COLL_FLOAT16,  COLL_BFLOAT16,
                                          COLL_FLOAT32, COLL_FLOAT64};
static const coll_op_t all_ops[] = {COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG};
#define NDTYPES (sizeof all_dtypes / sizeof all_dtypes[0])
#define NOPS (sizeof all_ops / sizeof all_ops[0])

static inline int f16_is_nan(uint16_t h)
{
  return (h & 0x7C00) == 0x7C00 && (h & 0x03FF);
}

static inline int bf16_is_nan(uint16_t h)
{
  return (h & 0x7F80) == 0x7F80 && (h & 0x007F);
}

/* The last line, "N passed, N failed"; returns main's exit status. */
static inline int reduce_check_finish(void)
{
  printf("%lu passed, %lu failed\n", test_passed, test_failed);
  return test_failed ? 1 : 0;
}

#endif
