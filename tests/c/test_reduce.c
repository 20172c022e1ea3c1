/*
 * test_reduce.c - unit test of the local reduction kernels (libcoll/src/reduce.c).
 *
 * Every dtype x op x count {0, 1, 7, 4099} x ninputs {1, 2, 3, 8}, out of
 * place and in place (out == inputs[0], out == inputs[last]), against a plain
 * scalar reference written here: it converts float16/bfloat16 with its own
 * (double, ldexp/rint based) code, so a shared bug in the bit tricks cannot
 * hide. Then fixed cases: integer wraparound, AVG truncation, float16 and
 * bfloat16 rounding and NaN, MIN/MAX NaN rules, exhaustive float16/bfloat16
 * round trips, a piecewise AVG finished in place, names, and the error returns.
 *
 * Prints failures to stderr and a last line "N passed, N failed"; exits 1 on
 * any failure.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

static unsigned long test_passed, test_failed;

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

static void *xmalloc(size_t n)
{
  void *p = malloc(n);
  if (p == NULL) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    exit(2);
  }
  return p;
}

static const coll_dtype_t all_dtypes[] = {COLL_INT8,    COLL_UINT8,    COLL_INT32,
                                          COLL_INT64,   COLL_FLOAT16,  COLL_BFLOAT16,
                                          COLL_FLOAT32, COLL_FLOAT64};
static const coll_op_t all_ops[] = {COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG};
#define NDTYPES (sizeof all_dtypes / sizeof all_dtypes[0])
#define NOPS (sizeof all_ops / sizeof all_ops[0])

/* ---- random numbers (splitmix64: deterministic across runs) ---- */
static uint64_t rng_state = 0x1234567887654321u;

static uint64_t rng_next(void)
{
  uint64_t z = (rng_state += 0x9E3779B97F4A7C15u);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
  return z ^ (z >> 31);
}

/* ---- reference conversions: arithmetic, not bit tricks ---- */
static float ref_f16_to_f32(uint16_t h)
{
  int e = (h >> 10) & 31;
  int m = h & 1023;
  double v;
  if (e == 31)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -24);
  else
    v = ldexp(1024 + m, e - 25);
  return (float)((h & 0x8000) ? -v : v);
}

static uint16_t ref_f32_to_f16(float f)
{
  uint16_t s = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isnan(f))
    return s | 0x7E00;
  if (isinf(f))
    return s | 0x7C00;
  if (a < 0x1p-14) /* subnormal; m == 1024 encodes the smallest normal */
    return (uint16_t)(s | (uint16_t)rint(a * 0x1p24));
  int e;
  frexp(a, &e);
  int E = e - 1; /* a in [2^E, 2^(E+1)) */
  double m = rint(ldexp(a, 10 - E));
  if (m == 2048.0) {
    m = 1024.0;
    E++;
  }
  if (E > 15)
    return s | 0x7C00;
  return (uint16_t)(s | ((E + 15) << 10) | (uint16_t)(m - 1024.0));
}

static float ref_bf16_to_f32(uint16_t h)
{
  int e = (h >> 7) & 255;
  int m = h & 127;
  double v;
  if (e == 255)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp(m, -133);
  else
    v = ldexp(128 + m, e - 134);
  return (float)((h & 0x8000) ? -v : v);
}

static uint16_t ref_f32_to_bf16(float f)
{
  uint16_t s = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isnan(f))
    return s | 0x7FC0;
  if (isinf(f))
    return s | 0x7F80;
  if (a < 0x1p-126)
    return (uint16_t)(s | (uint16_t)rint(a * 0x1p133));
  int e;
  frexp(a, &e);
  int E = e - 1;
  double m = rint(ldexp(a, 7 - E));
  if (m == 256.0) {
    m = 128.0;
    E++;
  }
  if (E > 127)
    return s | 0x7F80;
  return (uint16_t)(s | ((E + 127) << 7) | (uint16_t)(m - 128.0));
}

static int f16_is_nan(uint16_t h)
{
  return (h & 0x7C00) == 0x7C00 && (h & 0x03FF);
}

static int bf16_is_nan(uint16_t h)
{
  return (h & 0x7F80) == 0x7F80 && (h & 0x007F);
}

/* ---- element access ---- */
static int is_int(coll_dtype_t t)
{
  return t == COLL_INT8 || t == COLL_UINT8 || t == COLL_INT32 || t == COLL_INT64;
}

static int64_t get_int(coll_dtype_t t, const void *p, size_t i)
{
  switch (t) {
  case COLL_INT8: return ((const int8_t *)p)[i];
  case COLL_UINT8: return ((const uint8_t *)p)[i];
  case COLL_INT32: return ((const int32_t *)p)[i];
  default: return ((const int64_t *)p)[i];
  }
}

/* Store the low bits of a wrapped value; returns the stored value, sign- or
 * zero-extended. */
static int64_t put_int(coll_dtype_t t, void *p, size_t i, uint64_t v)
{
  switch (t) {
  case COLL_INT8: return ((int8_t *)p)[i] = (int8_t)(uint8_t)v;
  case COLL_UINT8: return ((uint8_t *)p)[i] = (uint8_t)v;
  case COLL_INT32: return ((int32_t *)p)[i] = (int32_t)(uint32_t)v;
  default: return ((int64_t *)p)[i] = (int64_t)v;
  }
}

/* float16/bfloat16/float32 as float */
static float get_f(coll_dtype_t t, const void *p, size_t i)
{
  switch (t) {
  case COLL_FLOAT16: return ref_f16_to_f32(((const uint16_t *)p)[i]);
  case COLL_BFLOAT16: return ref_bf16_to_f32(((const uint16_t *)p)[i]);
  default: return ((const float *)p)[i];
  }
}

static void put_f(coll_dtype_t t, void *p, size_t i, float v)
{
  switch (t) {
  case COLL_FLOAT16: ((uint16_t *)p)[i] = ref_f32_to_f16(v); break;
  case COLL_BFLOAT16: ((uint16_t *)p)[i] = ref_f32_to_bf16(v); break;
  default: ((float *)p)[i] = v; break;
  }
}

/* ---- the reference reduction: one element at a time, left to right ---- */
static void ref_reduce(coll_dtype_t t, coll_op_t op, void *out, const void *const *in,
                       size_t nin, size_t count, size_t divisor)
{
  for (size_t i = 0; i < count; i++) {
    if (is_int(t)) {
      int64_t acc = get_int(t, in[0], i);
      uint64_t wrap = (uint64_t)acc;
      for (size_t k = 1; k < nin; k++) {
        int64_t v = get_int(t, in[k], i);
        if (op == COLL_SUM || op == COLL_AVG)
          wrap += (uint64_t)v;
        else if (op == COLL_PROD)
          wrap *= (uint64_t)v;
        else if (op == COLL_MIN)
          acc = v < acc ? v : acc;
        else
          acc = v > acc ? v : acc;
      }
      if (op == COLL_MIN || op == COLL_MAX) {
        put_int(t, out, i, (uint64_t)acc);
      } else {
        int64_t s = put_int(t, out, i, wrap); /* the sum as the dtype holds it */
        if (op == COLL_AVG)
          put_int(t, out, i, (uint64_t)(s / (int64_t)divisor));
      }
    } else if (t == COLL_FLOAT64) {
      const double *const *x = (const double *const *)in;
      double acc = x[0][i];
      for (size_t k = 1; k < nin; k++) {
        double v = x[k][i];
        if (op == COLL_SUM || op == COLL_AVG)
          acc = acc + v;
        else if (op == COLL_PROD)
          acc = acc * v;
        else if (op == COLL_MIN)
          acc = (v < acc || v != v) ? v : acc;
        else
          acc = (v > acc || v != v) ? v : acc;
      }
      if (op == COLL_AVG)
        acc = acc / (double)divisor;
      ((double *)out)[i] = acc;
    } else {
      float acc = get_f(t, in[0], i);
      for (size_t k = 1; k < nin; k++) {
        float v = get_f(t, in[k], i);
        if (op == COLL_SUM || op == COLL_AVG)
          acc = acc + v;
        else if (op == COLL_PROD)
          acc = acc * v;
        else if (op == COLL_MIN)
          acc = (v < acc || v != v) ? v : acc;
        else
          acc = (v > acc || v != v) ? v : acc;
      }
      if (op == COLL_AVG)
        acc = acc / (float)divisor;
      put_f(t, out, i, acc);
    }
  }
}

/* Bitwise equal, except that any NaN equals any NaN of the same dtype. */
static int elem_equal(coll_dtype_t t, const void *a, const void *b, size_t i)
{
  size_t sz = coll_dtype_size(t);
  if (memcmp((const char *)a + i * sz, (const char *)b + i * sz, sz) == 0)
    return 1;
  switch (t) {
  case COLL_FLOAT16:
    return f16_is_nan(((const uint16_t *)a)[i]) && f16_is_nan(((const uint16_t *)b)[i]);
  case COLL_BFLOAT16:
    return bf16_is_nan(((const uint16_t *)a)[i]) && bf16_is_nan(((const uint16_t *)b)[i]);
  case COLL_FLOAT32: return isnan(((const float *)a)[i]) && isnan(((const float *)b)[i]);
  case COLL_FLOAT64: return isnan(((const double *)a)[i]) && isnan(((const double *)b)[i]);
  default: return 0;
  }
}

/* First index where got and want differ, or count. */
static size_t first_diff(coll_dtype_t t, const void *got, const void *want, size_t count)
{
  for (size_t i = 0; i < count; i++) {
    if (!elem_equal(t, got, want, i))
      return i;
  }
  return count;
}

/* Random inputs: half raw bit patterns (wraparound, subnormals, Inf, NaN),
 * half "tame" values whose sums and products stay meaningful. */
static void fill_random(coll_dtype_t t, void *p, size_t count)
{
  for (size_t i = 0; i < count; i++) {
    uint64_t r = rng_next();
    int raw = (r & 1) != 0;
    r >>= 1;
    int tame_int = (int)(r % 21) - 10;
    float tame_f = (float)((int64_t)(r % 20001) - 10000) / 64.0f;
    switch (t) {
    case COLL_INT8: ((int8_t *)p)[i] = raw ? (int8_t)(uint8_t)r : (int8_t)tame_int; break;
    case COLL_UINT8: ((uint8_t *)p)[i] = raw ? (uint8_t)r : (uint8_t)(tame_int + 10); break;
    case COLL_INT32: ((int32_t *)p)[i] = raw ? (int32_t)(uint32_t)r : tame_int; break;
    case COLL_INT64: ((int64_t *)p)[i] = raw ? (int64_t)r : tame_int; break;
    case COLL_FLOAT16:
      ((uint16_t *)p)[i] = raw ? (uint16_t)r : ref_f32_to_f16(tame_f / 256.0f);
      break;
    case COLL_BFLOAT16: ((uint16_t *)p)[i] = raw ? (uint16_t)r : ref_f32_to_bf16(tame_f); break;
    case COLL_FLOAT32: {
      uint32_t bits = (uint32_t)(r >> 16);
      float f;
      memcpy(&f, &bits, sizeof f);
      /* raw float32 patterns are mostly huge or tiny; use few of them */
      ((float *)p)[i] = (raw && (r & 0xF) == 0) ? f : tame_f * 1.0009765625f;
      break;
    }
    case COLL_FLOAT64: {
      double d;
      memcpy(&d, &r, sizeof d);
      ((double *)p)[i] = (raw && (r & 0xF) == 0) ? d : (double)tame_f * 1.0000000001;
      break;
    }
    default: break;
    }
  }
}

/* ---- the matrix ---- */
enum { MODE_OUT_OF_PLACE, MODE_IN_FIRST, MODE_IN_LAST, MODE_COUNT };
static const char *const mode_names[] = {"out-of-place", "out==inputs[0]", "out==inputs[last]"};

static void test_case(coll_dtype_t t, coll_op_t op, size_t count, size_t nin, int mode)
{
  size_t sz = coll_dtype_size(t);
  size_t bytes = count > 0 ? count * sz : 1; /* exact sizes: ASan sees overruns */
  void *in[8], *saved[8];
  for (size_t k = 0; k < nin; k++) {
    in[k] = xmalloc(bytes);
    saved[k] = xmalloc(bytes);
    memset(in[k], 0xA5, bytes);
    fill_random(t, in[k], count);
    memcpy(saved[k], in[k], bytes);
  }
  void *want = xmalloc(bytes);
  void *own = xmalloc(bytes);
  memset(own, 0x5A, bytes);
  size_t divisor = mode == MODE_OUT_OF_PLACE ? nin : 3;
  ref_reduce(t, op, want, (const void *const *)saved, nin, count, divisor);

  void *out = mode == MODE_IN_FIRST ? in[0] : mode == MODE_IN_LAST ? in[nin - 1] : own;
  int rc = coll_reduce_local(t, op, out, (const void *const *)in, nin, count, divisor);
  CHECK(rc == 0, "%s %s count %zu nin %zu %s: rc %d", coll_dtype_name(t), coll_op_name(op),
        count, nin, mode_names[mode], rc);
  if (count == 0) {
    int untouched = 1;
    for (size_t k = 0; k < nin; k++)
      untouched &= ((unsigned char *)in[k])[0] == 0xA5;
    untouched &= ((unsigned char *)own)[0] == 0x5A;
    CHECK(untouched, "%s %s count 0: a buffer was written", coll_dtype_name(t),
          coll_op_name(op));
  } else {
    size_t d = first_diff(t, out, want, count);
    CHECK(d == count, "%s %s count %zu nin %zu %s: element %zu differs", coll_dtype_name(t),
          coll_op_name(op), count, nin, mode_names[mode], d);
    int others_intact = 1; /* inputs that are not `out` must not change */
    for (size_t k = 0; k < nin; k++) {
      if (in[k] != out)
        others_intact &= memcmp(in[k], saved[k], bytes) == 0;
    }
    CHECK(others_intact, "%s %s count %zu nin %zu %s: an input was modified",
          coll_dtype_name(t), coll_op_name(op), count, nin, mode_names[mode]);
  }
  for (size_t k = 0; k < nin; k++) {
    free(in[k]);
    free(saved[k]);
  }
  free(want);
  free(own);
}

static void test_matrix(void)
{
  static const size_t counts[] = {0, 1, 7, 4099};
  static const size_t nins[] = {1, 2, 3, 8};
  for (size_t a = 0; a < NDTYPES; a++)
    for (size_t b = 0; b < NOPS; b++)
      for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
        for (size_t d = 0; d < sizeof nins / sizeof nins[0]; d++)
          for (int m = 0; m < MODE_COUNT; m++)
            test_case(all_dtypes[a], all_ops[b], counts[c], nins[d], m);
}

/* Inputs that start at odd element offsets, so vector loops meet unaligned data. */
static void test_unaligned(void)
{
  for (size_t a = 0; a < NDTYPES; a++) {
    coll_dtype_t t = all_dtypes[a];
    size_t sz = coll_dtype_size(t), count = 4099, nin = 3;
    char *buf[3];
    const void *in[3];
    for (size_t k = 0; k < nin; k++) {
      buf[k] = xmalloc((count + 3) * sz);
      in[k] = buf[k] + (k + 1) * sz;
      fill_random(t, (void *)in[k], count);
    }
    char *outbuf = xmalloc((count + 1) * sz);
    char *want = xmalloc(count * sz);
    for (size_t b = 0; b < NOPS; b++) {
      ref_reduce(t, all_ops[b], want, in, nin, count, 3);
      int rc = coll_reduce_local(t, all_ops[b], outbuf + sz, in, nin, count, 3);
      CHECK(rc == 0 && first_diff(t, outbuf + sz, want, count) == count,
            "unaligned %s %s: rc %d", coll_dtype_name(t), coll_op_name(all_ops[b]), rc);
    }
    for (size_t k = 0; k < nin; k++)
      free(buf[k]);
    free(outbuf);
    free(want);
  }
}

/* ---- fixed cases ---- */

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

/* Every float16 / bfloat16 value through load + store (SUM, one input), and
 * through AVG by 3 and 10 (arbitrary float32 values to round, subnormals too). */
static void test_half_exhaustive(void)
{
  uint16_t *all = xmalloc(65536 * sizeof *all), *out = xmalloc(65536 * sizeof *out);
  uint16_t *want = xmalloc(65536 * sizeof *want);
  for (size_t i = 0; i < 65536; i++)
    all[i] = (uint16_t)i;
  const void *in[1] = {all};
  static const coll_dtype_t halves[] = {COLL_FLOAT16, COLL_BFLOAT16};
  static const size_t divisors[] = {3, 10};
  for (size_t h = 0; h < 2; h++) {
    coll_dtype_t t = halves[h];
    int (*is_nan)(uint16_t) = t == COLL_FLOAT16 ? f16_is_nan : bf16_is_nan;
    int rc = coll_reduce_local(t, COLL_SUM, out, in, 1, 65536, 1);
    size_t bad = 0;
    for (size_t i = 0; i < 65536; i++)
      bad += is_nan(all[i]) ? !is_nan(out[i]) : out[i] != all[i];
    CHECK(rc == 0 && bad == 0, "%s round trip: rc %d, %zu values changed", coll_dtype_name(t),
          rc, bad);
    for (size_t d = 0; d < 2; d++) {
      ref_reduce(t, COLL_AVG, want, in, 1, 65536, divisors[d]);
      rc = coll_reduce_local(t, COLL_AVG, out, in, 1, 65536, divisors[d]);
      size_t i = first_diff(t, out, want, 65536);
      CHECK(rc == 0 && i == 65536, "%s avg /%zu: rc %d, first difference at 0x%04zx",
            coll_dtype_name(t), divisors[d], rc, i);
    }
  }
  free(all);
  free(out);
  free(want);
}

/* Divide a sum made piecewise in place: AVG with one input, as an algorithm that sums in
 * pieces would finish it. */
static int avg_finish(coll_dtype_t dtype, void *buf, size_t count, size_t divisor)
{
  const void *inputs[1] = {buf};
  return coll_reduce_local(dtype, COLL_AVG, buf, inputs, 1, count, divisor);
}

static void test_avg_finish(void)
{
  static const size_t counts[] = {0, 1, 7, 4099};
  for (size_t a = 0; a < NDTYPES; a++) {
    coll_dtype_t t = all_dtypes[a];
    size_t sz = coll_dtype_size(t);
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      size_t count = counts[c], bytes = count ? count * sz : 1;
      void *buf = xmalloc(bytes), *want = xmalloc(bytes);
      memset(buf, 0x77, bytes);
      fill_random(t, buf, count);
      const void *in[1] = {buf};
      ref_reduce(t, COLL_AVG, want, in, 1, count, 7);
      int rc = avg_finish(t, buf, count, 7);
      CHECK(rc == 0 && (count ? first_diff(t, buf, want, count) == count
                              : ((unsigned char *)buf)[0] == 0x77),
            "avg_finish %s count %zu: rc %d", coll_dtype_name(t), count, rc);
      free(buf);
      free(want);
    }
  }
  /* a sum made piecewise, then finished: same as a one-shot AVG for integers */
  int32_t x[3] = {-7, 100, -2147483647}, y[3] = {0, 3, -2}, sum[3], one[3];
  const void *in[2] = {x, y};
  CHECK(coll_reduce_local(COLL_INT32, COLL_SUM, sum, in, 2, 3, 0) == 0 &&
            avg_finish(COLL_INT32, sum, 3, 2) == 0 &&
            coll_reduce_local(COLL_INT32, COLL_AVG, one, in, 2, 3, 2) == 0 &&
            memcmp(sum, one, sizeof sum) == 0 && sum[0] == -3 && sum[1] == 51 &&
            sum[2] == 1073741823,
        "int32 piecewise avg");
  float f = 1.0f;
  CHECK(avg_finish(COLL_FLOAT32, &f, 1, 0) == COLL_EBADARG, "finish divisor 0");
  CHECK(avg_finish(COLL_DTYPE_COUNT, &f, 1, 2) == COLL_EBADARG, "finish dtype");
  CHECK(avg_finish(COLL_FLOAT32, NULL, 1, 2) == COLL_EBADARG, "finish NULL");
  CHECK(avg_finish(COLL_FLOAT32, NULL, 0, 2) == 0, "finish NULL count 0");
  CHECK(f == 1.0f, "finish errors touched the buffer");
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
  test_matrix();
  test_unaligned();
  test_int_wraparound();
  test_avg();
  test_half_rounding();
  test_minmax_nan();
  test_half_exhaustive();
  test_avg_finish();
  printf("%lu passed, %lu failed\n", test_passed, test_failed);
  return test_failed ? 1 : 0;
}
