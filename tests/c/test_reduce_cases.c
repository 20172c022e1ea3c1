/*
 * test_reduce_cases.c - fixed cases of the local reduction kernels (libcoll/src/reduce.c),
 * one element per input with the expected result written out: integer wraparound and
 * signed / unsigned MIN/MAX, AVG truncation and huge divisors, float16 and bfloat16
 * rounding (ties to even, rounded once at the end, overflow, subnormals) and NaN, MIN/MAX
 * NaN and signed-zero rules; then the dtype and op names and sizes, and the error
 * returns. The random matrix against a scalar reference is test_reduce.c's. Built twice:
 * under ASan/UBSan and as the library ships (-O3, test_reduce_cases_release).
 *
 * Prints failures to stderr and a last line "N passed, N failed"; exits 1 on
 * any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "coll.h"
#include "reduce_check.h"

/* Reduce a column of ninputs scalars (one element each) and return the result bytes. */
static int reduce1(coll_dtype_t t, coll_op_t op, const void *vals, size_t nin, size_t divisor,
                   void *out)
{
  const void *in[8];
  size_t sz = coll_dtype_size(t);
  for (size_t k = 0; k < nin; k++)
    in[k] = (const char *)vals + k * sz;
  return coll_reduce_local(t, op, out, in, nin, 1, divisor);
}

#define EXPECT1(T, dt, op, divisor, want, ...)                                              \
  do {                                                                                     \
    const T vals_[] = {__VA_ARGS__};                                                       \
    T out_ = 0;                                                                            \
    int rc_ = reduce1(dt, op, vals_, sizeof vals_ / sizeof vals_[0], divisor, &out_);      \
    CHECK(rc_ == 0 && out_ == (T)(want), "%s %s {%s} /%zu: got %lld want %lld",          \
          coll_dtype_name(dt), coll_op_name(op), #__VA_ARGS__, (size_t)(divisor),          \
          (long long)out_, (long long)(T)(want));                                          \
  } while (0)

#define EXPECT16(dt, op, divisor, want, ...)                                                \
  do {                                                                                     \
    const uint16_t vals_[] = {__VA_ARGS__};                                                \
    uint16_t out_ = 0;                                                                     \
    int rc_ = reduce1(dt, op, vals_, sizeof vals_ / sizeof vals_[0], divisor, &out_);      \
    CHECK(rc_ == 0 && out_ == (want), "%s %s {%s}: got 0x%04x want 0x%04x",              \
          coll_dtype_name(dt), coll_op_name(op), #__VA_ARGS__, out_, (unsigned)(want));    \
  } while (0)

#define EXPECT16_NAN(dt, isnan_fn, op, ...)                                                 \
  do {                                                                                     \
    const uint16_t vals_[] = {__VA_ARGS__};                                                \
    uint16_t out_ = 0;                                                                     \
    int rc_ = reduce1(dt, op, vals_, sizeof vals_ / sizeof vals_[0], 1, &out_);            \
    CHECK(rc_ == 0 && isnan_fn(out_), "%s %s {%s}: got 0x%04x, want NaN",                \
          coll_dtype_name(dt), coll_op_name(op), #__VA_ARGS__, out_);                      \
  } while (0)

static void test_int_wraparound(void)
{
  EXPECT1(int8_t, COLL_INT8, COLL_SUM, 1, INT8_MIN, 127, 1);
  EXPECT1(int8_t, COLL_INT8, COLL_SUM, 1, 44, 100, 100, 100);
  EXPECT1(int8_t, COLL_INT8, COLL_SUM, 1, 127, -128, -1);
  EXPECT1(int8_t, COLL_INT8, COLL_PROD, 1, 0, 16, 16);
  EXPECT1(int8_t, COLL_INT8, COLL_PROD, 1, -128, -128, -1);
  EXPECT1(int8_t, COLL_INT8, COLL_PROD, 1, 1, -1, -1);
  EXPECT1(uint8_t, COLL_UINT8, COLL_SUM, 1, 0, 255, 1);
  EXPECT1(uint8_t, COLL_UINT8, COLL_PROD, 1, 16, 16, 17);
  EXPECT1(uint8_t, COLL_UINT8, COLL_PROD, 1, 1, 255, 255);
  EXPECT1(int32_t, COLL_INT32, COLL_SUM, 1, INT32_MIN, INT32_MAX, 1);
  EXPECT1(int32_t, COLL_INT32, COLL_SUM, 1, INT32_MAX, INT32_MIN, -1);
  EXPECT1(int32_t, COLL_INT32, COLL_PROD, 1, 0, 65536, 65536);
  EXPECT1(int32_t, COLL_INT32, COLL_PROD, 1, INT32_MIN, INT32_MIN, -1);
  EXPECT1(int64_t, COLL_INT64, COLL_SUM, 1, INT64_MIN, INT64_MAX, 1);
  EXPECT1(int64_t, COLL_INT64, COLL_SUM, 1, INT64_MAX, INT64_MIN, -1);
  EXPECT1(int64_t, COLL_INT64, COLL_PROD, 1, (int64_t)0x200000001, 0x100000001, 0x100000001);
  EXPECT1(int64_t, COLL_INT64, COLL_PROD, 1, INT64_MIN, INT64_MIN, -1);
  /* min/max compare signed for signed types, unsigned for uint8 */
  EXPECT1(int8_t, COLL_INT8, COLL_MIN, 1, -128, 127, -128, 0);
  EXPECT1(int8_t, COLL_INT8, COLL_MAX, 1, 127, 127, -128, 0);
  EXPECT1(uint8_t, COLL_UINT8, COLL_MAX, 1, 255, 1, 255, 128);
  EXPECT1(int64_t, COLL_INT64, COLL_MIN, 1, INT64_MIN, 5, INT64_MIN, INT64_MAX);
  EXPECT1(int64_t, COLL_INT64, COLL_MAX, 1, INT64_MAX, 5, INT64_MIN, INT64_MAX);
}

static void test_avg(void)
{
  /* integers: the wrapped sum, divided with C truncation (toward zero) */
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 2, -3, -7, 0);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 2, 3, 7, 0);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 2, -1, -1, -1, -1);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 1, INT32_MIN, INT32_MIN);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 3, -715827882, INT32_MIN, 0, 0);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, 2, INT32_MIN / 2, INT32_MAX, 1); /* wrapped */
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, SIZE_MAX, 0, INT32_MIN);
  EXPECT1(int32_t, COLL_INT32, COLL_AVG, (size_t)1 << 31, -1, INT32_MIN);
  EXPECT1(int8_t, COLL_INT8, COLL_AVG, 2, 63, -128, -1); /* sum wraps to 127 */
  EXPECT1(int8_t, COLL_INT8, COLL_AVG, 3, -42, -128, 0, 1);
  EXPECT1(int8_t, COLL_INT8, COLL_AVG, 1000, 0, -128);
  EXPECT1(uint8_t, COLL_UINT8, COLL_AVG, 2, 22, 200, 100); /* 300 wraps to 44 */
  EXPECT1(uint8_t, COLL_UINT8, COLL_AVG, 2, 127, 255);
  EXPECT1(int64_t, COLL_INT64, COLL_AVG, 2, INT64_MIN / 2, INT64_MIN, 0);
  EXPECT1(int64_t, COLL_INT64, COLL_AVG, 3, -3074457345618258602, INT64_MIN, 0, 0);
  EXPECT1(int64_t, COLL_INT64, COLL_AVG, 7, -1, -7, -1, 1);
  EXPECT1(int64_t, COLL_INT64, COLL_AVG, SIZE_MAX, 0, INT64_MIN);
  if (sizeof(size_t) >= 8) {
    EXPECT1(int64_t, COLL_INT64, COLL_AVG, (size_t)INT64_MAX + 1, -1, INT64_MIN);
    EXPECT1(int64_t, COLL_INT64, COLL_AVG, (size_t)INT64_MAX + 1, 0, INT64_MAX);
    EXPECT1(int64_t, COLL_INT64, COLL_AVG, (size_t)INT64_MAX, -1, INT64_MIN);
  }
  /* floats: divide the accumulated value */
  EXPECT1(float, COLL_FLOAT32, COLL_AVG, 2, 1.5f, 1.0f, 2.0f);
  EXPECT1(float, COLL_FLOAT32, COLL_AVG, 3, 7.0f / 3.0f, 1.0f, 2.0f, 4.0f);
  EXPECT1(float, COLL_FLOAT32, COLL_AVG, 2, -0.5f, -1.0f, 0.0f);
  EXPECT1(double, COLL_FLOAT64, COLL_AVG, 2, 1.5, 1.0, 2.0);
  EXPECT1(double, COLL_FLOAT64, COLL_AVG, 3, 0.1 / 3.0, 0.1);
  EXPECT16(COLL_FLOAT16, COLL_AVG, 2, 0x3E00, 0x3C00, 0x4000);   /* (1 + 2) / 2 = 1.5 */
  EXPECT16(COLL_BFLOAT16, COLL_AVG, 2, 0x3FC0, 0x3F80, 0x4000);  /* 1.5 */
  /* 8 x 65504 overflows float16 but not the float32 accumulator */
  EXPECT16(COLL_FLOAT16, COLL_AVG, 8, 0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF, 0x7BFF,
           0x7BFF, 0x7BFF);
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x7C00, 0x7BFF, 0x7BFF);
}

static void test_half_rounding(void)
{
  /* float16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even wins */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x3C00, 0x3C00, 0x1000);
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x3C02, 0x3C01, 0x1000);
  /* rounded once at the end: stepwise rounding would give 1.0 */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x3C01, 0x3C00, 0x1000, 0x1000);
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x3C01, 0x3C00, 0x0C00, 0x0C00, 0x0C00, 0x0C00);
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x7C00, 0x7BFF, 0x4C00); /* 65520 rounds to Inf */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x7BFF, 0x7BFF, 0x4B80); /* 65519 does not */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x0002, 0x0001, 0x0001); /* subnormals */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x0400, 0x03FF, 0x0001); /* into the normals */
  EXPECT16(COLL_FLOAT16, COLL_AVG, 2, 0x0000, 0x0001);         /* 2^-25: tie to 0 */
  EXPECT16(COLL_FLOAT16, COLL_AVG, 2, 0x0002, 0x0003);         /* 1.5 ulp: tie to 2 */
  EXPECT16(COLL_FLOAT16, COLL_PROD, 1, 0x0000, 0x0001, 0x3800); /* 2^-24 * 0.5 -> 0 */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x8000, 0x8000, 0x8000); /* -0 + -0 = -0 */
  EXPECT16(COLL_FLOAT16, COLL_SUM, 1, 0x0000, 0x8000, 0x0000);
  EXPECT16(COLL_FLOAT16, COLL_PROD, 1, 0xC400, 0xC000, 0x4000); /* -2 * 2 = -4 */
  EXPECT16(COLL_FLOAT16, COLL_MAX, 1, 0xFC00, 0xFC00, 0xFC00);  /* -Inf */
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_SUM, 0x7E00, 0x3C00);
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_SUM, 0x3C00, 0x7C01); /* signalling */
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_SUM, 0x7C00, 0xFC00); /* Inf - Inf */
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_MIN, 0xFE00, 0x3C00);
  /* bfloat16: same ties with an 8-bit significand */
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0x3F80, 0x3F80, 0x3B80);
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0x3F82, 0x3F81, 0x3B80);
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0x3F81, 0x3F80, 0x3B80, 0x3B80);
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0x7F80, 0x7F7F, 0x7F7F);  /* overflow to Inf */
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0xFF80, 0xFF7F, 0xFF7F);  /* and -Inf */
  EXPECT16(COLL_BFLOAT16, COLL_SUM, 1, 0x0002, 0x0001, 0x0001);  /* subnormals */
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_SUM, 0x7FC0, 0x3F80);
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_SUM, 0x7F81, 0x0000); /* not Inf */
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_SUM, 0xFFFF, 0x3F80); /* not -0 */
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_MAX, 0x7F81, 0x3F80);
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_PROD, 0x7F80, 0x0000); /* Inf * 0 */
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_AVG, 0xFFC1);
}

/* MIN/MAX propagate a NaN from any input, first or later (NumPy, MPI). */
static void test_minmax_nan(void)
{
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_MAX, 0x7E00, 0x3C00, 0x4000);
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_MAX, 0x4000, 0x3C00, 0x7E00);
  EXPECT16_NAN(COLL_FLOAT16, f16_is_nan, COLL_MIN, 0x3C00, 0x7E00);
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_MIN, 0x3F80, 0x7FC0);
  EXPECT16_NAN(COLL_BFLOAT16, bf16_is_nan, COLL_MAX, 0x3F80, 0x4000, 0x7FC0, 0x3F80);
  const float fv[] = {NAN, 1.0f}, fw[] = {1.0f, NAN}, f3[] = {1.0f, 2.0f, NAN};
  float fo;
  CHECK(reduce1(COLL_FLOAT32, COLL_MIN, fv, 2, 1, &fo) == 0 && isnan(fo), "f32 min NaN first");
  CHECK(reduce1(COLL_FLOAT32, COLL_MAX, fv, 2, 1, &fo) == 0 && isnan(fo), "f32 max NaN first");
  CHECK(reduce1(COLL_FLOAT32, COLL_MIN, fw, 2, 1, &fo) == 0 && isnan(fo), "f32 min NaN later");
  CHECK(reduce1(COLL_FLOAT32, COLL_MAX, fw, 2, 1, &fo) == 0 && isnan(fo), "f32 max NaN later");
  CHECK(reduce1(COLL_FLOAT32, COLL_MAX, f3, 3, 1, &fo) == 0 && isnan(fo), "f32 max NaN last of 3");
  const double dv[] = {NAN, 1.0}, dw[] = {1.0, NAN};
  double d;
  CHECK(reduce1(COLL_FLOAT64, COLL_MIN, dv, 2, 1, &d) == 0 && isnan(d), "f64 min NaN first");
  CHECK(reduce1(COLL_FLOAT64, COLL_MAX, dw, 2, 1, &d) == 0 && isnan(d), "f64 max NaN later");
  CHECK(reduce1(COLL_FLOAT64, COLL_MIN, dw, 2, 1, &d) == 0 && isnan(d), "f64 min NaN later");
  /* signed zeros: the earlier input wins the tie */
  const float z1[] = {-0.0f, 0.0f}, z2[] = {0.0f, -0.0f};
  CHECK(reduce1(COLL_FLOAT32, COLL_MIN, z1, 2, 1, &fo) == 0 && signbit(fo), "min(-0, +0)");
  CHECK(reduce1(COLL_FLOAT32, COLL_MIN, z2, 2, 1, &fo) == 0 && !signbit(fo), "min(+0, -0)");
}

static void test_errors(void)
{
  float a[2] = {1.0f, 2.0f}, b[2] = {3.0f, 4.0f}, out[2] = {-1.0f, -1.0f};
  const void *in[2] = {a, b};
  const void *in_null[2] = {a, NULL};
  CHECK(coll_reduce_local(COLL_DTYPE_COUNT, COLL_SUM, out, in, 2, 2, 1) == COLL_EBADARG,
        "dtype COUNT");
  CHECK(coll_reduce_local((coll_dtype_t)-1, COLL_SUM, out, in, 2, 2, 1) == COLL_EBADARG,
        "dtype -1");
  CHECK(coll_reduce_local((coll_dtype_t)1000, COLL_SUM, out, in, 2, 2, 1) == COLL_EBADARG,
        "dtype 1000");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_OP_COUNT, out, in, 2, 2, 1) == COLL_EBADARG,
        "op COUNT");
  CHECK(coll_reduce_local(COLL_FLOAT32, (coll_op_t)-1, out, in, 2, 2, 1) == COLL_EBADARG,
        "op -1");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, out, in, 0, 2, 1) == COLL_EBADARG,
        "ninputs 0");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, out, in, 0, 0, 1) == COLL_EBADARG,
        "ninputs 0, count 0");
  CHECK(coll_reduce_local(COLL_DTYPE_COUNT, COLL_SUM, out, in, 2, 0, 1) == COLL_EBADARG,
        "bad dtype, count 0");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_AVG, out, in, 2, 2, 0) == COLL_EBADARG,
        "avg divisor 0");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, NULL, in, 2, 2, 1) == COLL_EBADARG,
        "out NULL");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, out, NULL, 2, 2, 1) == COLL_EBADARG,
        "inputs NULL");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, out, in_null, 2, 2, 1) == COLL_EBADARG,
        "inputs[1] NULL");
  CHECK(out[0] == -1.0f && out[1] == -1.0f, "an error wrote to out");
  /* count 0 touches nothing, so NULL pointers are fine; divisor 0 is fine off AVG */
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, NULL, NULL, 2, 0, 1) == 0, "count 0 NULL");
  CHECK(coll_reduce_local(COLL_FLOAT32, COLL_SUM, out, in, 2, 2, 0) == 0 && out[0] == 4.0f &&
            out[1] == 6.0f,
        "sum with divisor 0");
}

static void test_names(void)
{
  static const char *const dnames[] = {"int8",     "uint8",    "int32",   "int64",
                                       "float16",  "bfloat16", "float32", "float64"};
  static const size_t sizes[] = {1, 1, 4, 8, 2, 2, 4, 8};
  static const char *const onames[] = {"sum", "prod", "min", "max", "avg"};
  for (size_t a = 0; a < NDTYPES; a++) {
    CHECK(strcmp(coll_dtype_name(all_dtypes[a]), dnames[a]) == 0, "dtype name %zu", a);
    CHECK(coll_dtype_size(all_dtypes[a]) == sizes[a], "dtype size %zu", a);
  }
  for (size_t b = 0; b < NOPS; b++)
    CHECK(strcmp(coll_op_name(all_ops[b]), onames[b]) == 0, "op name %zu", b);
  CHECK(coll_dtype_size(COLL_DTYPE_COUNT) == 0, "size of unknown dtype");
  CHECK(coll_dtype_size((coll_dtype_t)-1) == 0, "size of dtype -1");
  CHECK(coll_dtype_name(COLL_DTYPE_COUNT) != NULL, "name of unknown dtype");
  CHECK(coll_op_name((coll_op_t)-1) != NULL, "name of unknown op");
}

int main(void)
{
  test_names();
  test_errors();
  test_int_wraparound();
  test_avg();
  test_half_rounding();
  test_minmax_nan();
  return reduce_check_finish();
}
