/*
 * reduce.h - internal helpers of the local reduction kernels (reduce.c).
 */
#ifndef COLL_REDUCE_H
#define COLL_REDUCE_H

#include <stddef.h>

#include "coll.h"

/* Divide buf[0..count) in place by `divisor`: the last step of COLL_AVG when
 * an algorithm produced the sum piecewise (e.g. reduce-scatter with COLL_SUM).
 * Integers: truncating C division of the stored (wrapped) value; float16 and
 * bfloat16: divided in float32 and rounded to nearest even; float32/float64:
 * divided in their own type. Bitwise the same as coll_reduce_local with
 * COLL_AVG and ninputs == 1. Returns 0, or COLL_EBADARG for an unknown dtype,
 * divisor == 0, or buf == NULL with count > 0. */
int coll__reduce_avg_finish(coll_dtype_t dtype, void *buf, size_t count, size_t divisor);

#endif /* COLL_REDUCE_H */
