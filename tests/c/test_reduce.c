/*
 * test_reduce.c - the local reduction kernels (libcoll/src/reduce.c) against a reference.
 *
 * Every dtype x op x count {0, 1, 7, 4099} x ninputs {1, 2, 3, 8}, out of
 * place and in place (out == inputs[0], out == inputs[last]), against a plain
 * scalar reference written here: it converts float16/bfloat16 with its own
 * (double, ldexp/rint based) code, so a shared bug in the bit tricks cannot
 * hide. Then inputs at odd element offsets, exhaustive float16/bfloat16 round
 * trips and AVG divisions, and a piecewise AVG finished in place. Fixed cases,
 * names and the error returns are test_reduce_cases.c's. Built twice: under
 * ASan/UBSan and as the library ships (-O3, test_reduce_release), the build that
 * runs the vector loops.
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
#include "reduce_check.h"

static void *xmalloc(size_t n)
{
  void *p = malloc(n);
  if (p == NULL) {
    fprintf(stderr, "out of memory (%zu bytes)\n", n);
    exit(2);
  }
  return p;
}

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

/* Every float16 / bfloat16 value through load + store (SUM, one input), and
 * through AVG by 2, 3, 8 and 10 (arbitrary float32 values to round, subnormals
 * too; by a power of two the kernels multiply by its reciprocal instead). */
static void test_half_exhaustive(void)
{
  uint16_t *all = xmalloc(65536 * sizeof *all), *out = xmalloc(65536 * sizeof *out);
  uint16_t *want = xmalloc(65536 * sizeof *want);
  for (size_t i = 0; i < 65536; i++)
    all[i] = (uint16_t)i;
  const void *in[1] = {all};
  static const coll_dtype_t halves[] = {COLL_FLOAT16, COLL_BFLOAT16};
  static const size_t divisors[] = {2, 3, 8, 10};
  for (size_t h = 0; h < 2; h++) {
    coll_dtype_t t = halves[h];
    int (*is_nan)(uint16_t) = t == COLL_FLOAT16 ? f16_is_nan : bf16_is_nan;
    int rc = coll_reduce_local(t, COLL_SUM, out, in, 1, 65536, 1);
    size_t bad = 0;
    for (size_t i = 0; i < 65536; i++)
      bad += is_nan(all[i]) ? !is_nan(out[i]) : out[i] != all[i];
    CHECK(rc == 0 && bad == 0, "%s round trip: rc %d, %zu values changed", coll_dtype_name(t),
          rc, bad);
    for (size_t d = 0; d < 4; d++) {
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

/* float32 and float64 AVG of two inputs by powers of two (the fused pass that multiplies
 * by the reciprocal) against the dividing reference, over bit patterns spread across the
 * whole range: subnormal results, infinities and NaNs included. */
static void test_avg_by_powers_of_two(void)
{
  enum { N = 1 << 16 };
  static const size_t divisors[] = {1, 2, 4, 64, (size_t)1 << 40};
  uint32_t *a = xmalloc(N * 4), *b = xmalloc(N * 4), *out = xmalloc(N * 8), *want = xmalloc(N * 8);
  uint64_t *a8 = xmalloc(N * 8), *b8 = xmalloc(N * 8);
  for (uint32_t i = 0; i < N; i++) {
    a[i] = i * 65537u + 12345u; /* every exponent, mixed mantissas */
    b[i] = (uint32_t)(i * 2654435761u);
    a8[i] = (uint64_t)a[i] << 32 | b[i];
    b8[i] = (uint64_t)b[i] << 32 | a[i];
  }
  for (size_t d = 0; d < sizeof divisors / sizeof divisors[0]; d++) {
    const void *in4[2] = {a, b}, *in8[2] = {a8, b8};
    ref_reduce(COLL_FLOAT32, COLL_AVG, want, in4, 2, N, divisors[d]);
    int rc = coll_reduce_local(COLL_FLOAT32, COLL_AVG, out, in4, 2, N, divisors[d]);
    size_t i = first_diff(COLL_FLOAT32, out, want, N);
    CHECK(rc == 0 && i == N, "float32 avg of 2 /%zu: rc %d, first difference at %zu", divisors[d], rc, i);
    ref_reduce(COLL_FLOAT64, COLL_AVG, want, in8, 2, N, divisors[d]);
    rc = coll_reduce_local(COLL_FLOAT64, COLL_AVG, out, in8, 2, N, divisors[d]);
    i = first_diff(COLL_FLOAT64, out, want, N);
    CHECK(rc == 0 && i == N, "float64 avg of 2 /%zu: rc %d, first difference at %zu", divisors[d], rc, i);
  }
  free(a);
  free(b);
  free(a8);
  free(b8);
  free(out);
  free(want);
}

int main(void)
{
  test_matrix();
  test_unaligned();
  test_half_exhaustive();
  test_avg_finish();
  test_avg_by_powers_of_two();
  return reduce_check_finish();
}
