/*
 * reduce.c - local reduction kernels: out[i] = op(in[0][i], ..., in[n-1][i]).
 *
 * This is the inner loop of every reducing collective, so it is written for
 * the auto-vectoriser:
 *
 *  - Two inputs (the common case: 2 ranks, or the flat path's pairs) take
 *    one direct pass, out[i] = in0[i] op in1[i], marked `GCC ivdep` so GCC
 *    vectorises without runtime overlap checks: out may be exactly in[0] or
 *    in[1] (each vector is loaded before the same positions are stored).
 *
 *  - Blocks. Otherwise each block of REDUCE_BLOCK elements is reduced into a local
 *    accumulator `acc` (in L1): acc = in[0], then acc = acc op in[k] for
 *    k = 1..n-1 in order, then out = acc. Because out is written only after
 *    every input of the block was read, `out` may be the very same buffer as
 *    any input. (Partial overlap, out = in + offset, is not supported.) The
 *    compiler can also prove that acc aliases nothing, so it needs no runtime
 *    overlap checks and never falls back to scalar code for in-place calls.
 *
 *  - Left to right, one rounding. Inputs are combined in index order and each
 *    element is independent, so vector width never changes a result: every
 *    rank (and every clone below) computes bitwise the same value. float16
 *    and bfloat16 accumulate in float32 and are rounded once, at the store.
 *    No -ffast-math: that would let the compiler reassociate.
 *
 *  - One kernel per dtype, with the op switch hoisted out of the element
 *    loops, cloned for AVX-512F (KNL, Xeon), AVX2 and baseline x86-64; the
 *    loader picks the clone once (ifunc), so the binary stays portable.
 *    float16 has, besides, kernels that convert with F16C / AVX-512F
 *    instructions, chosen at run time when the CPU has them.
 *
 * Integer SUM/PROD wrap around (computed in the unsigned type: no signed
 * overflow UB). AVG is SUM followed by a division by `divisor`; for integers
 * that is the truncating division of the wrapped sum, so an algorithm that
 * sums piecewise and then divides with a one-input AVG gets the same answer.
 */
#include "coll.h"

#include <stdint.h>
#include <string.h>

/* 1024 elements: acc is 4 KiB (8 KiB for float64), comfortably inside L1
 * next to the input lines being streamed; each input is read in page-sized
 * runs, which the hardware prefetchers follow well. */
#define REDUCE_BLOCK 1024

/* Clones need ifunc (glibc). COLL_REDUCE_NO_CLONES builds one variant for
 * the -m flags given, e.g. to test the AVX2 and baseline code on a machine
 * whose loader would pick AVX-512. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__GLIBC__) && defined(__has_attribute) && \
    !defined(COLL_REDUCE_NO_CLONES)
#if __has_attribute(target_clones)
#define REDUCE_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef REDUCE_CLONES
#define REDUCE_CLONES /* one build for the compiler's target (no ifunc here) */
#endif

/* Hardware float16 conversion (below): GCC 11+ on x86-64, which knows
 * __builtin_cpu_supports("f16c"). Other compilers use the portable kernel. */
#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11 && !defined(__clang__) && \
    !defined(COLL_REDUCE_NO_CLONES)
#define REDUCE_F16_HW 1
#include <immintrin.h>
#endif

/* ---- names and sizes ----------------------------------------------------- */

static const size_t reduce_dtype_sizes[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = 1,    [COLL_UINT8] = 1,    [COLL_INT32] = 4,   [COLL_INT64] = 8,
    [COLL_FLOAT16] = 2, [COLL_BFLOAT16] = 2, [COLL_FLOAT32] = 4, [COLL_FLOAT64] = 8,
};

static const char *const reduce_dtype_names[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = "int8",       [COLL_UINT8] = "uint8",       [COLL_INT32] = "int32",
    [COLL_INT64] = "int64",     [COLL_FLOAT16] = "float16",   [COLL_BFLOAT16] = "bfloat16",
    [COLL_FLOAT32] = "float32", [COLL_FLOAT64] = "float64",
};

static const char *const reduce_op_names[COLL_OP_COUNT] = {
    [COLL_SUM] = "sum", [COLL_PROD] = "prod", [COLL_MIN] = "min",
    [COLL_MAX] = "max", [COLL_AVG] = "avg",
};

/* Enums may be unsigned; casting both sides makes negative values invalid too. */
static int reduce_dtype_valid(coll_dtype_t dtype)
{
  return (unsigned)dtype < (unsigned)COLL_DTYPE_COUNT;
}

static int reduce_op_valid(coll_op_t op)
{
  return (unsigned)op < (unsigned)COLL_OP_COUNT;
}

size_t coll_dtype_size(coll_dtype_t dtype)
{
  return reduce_dtype_valid(dtype) ? reduce_dtype_sizes[dtype] : 0;
}

const char *coll_dtype_name(coll_dtype_t dtype)
{
  return reduce_dtype_valid(dtype) ? reduce_dtype_names[dtype] : "unknown";
}

const char *coll_op_name(coll_op_t op)
{
  return reduce_op_valid(op) ? reduce_op_names[op] : "unknown";
}

/* ---- float16 / bfloat16 conversions ---------------------------------------- */
/* Pure bit and float arithmetic, no branches and no tables, so that the
 * element loops vectorise on every target (F16C is not in the x86-64
 * baseline; see the hardware kernels further down). They are exact and do
 * not depend on FTZ/DAZ: no intermediate is subnormal unless the result
 * would be zero anyway. */

static inline uint32_t reduce_f32_bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float reduce_f32_from_bits(uint32_t u)
{
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* float16 -> float32 (exact). Normal numbers, Inf and NaN: put the 5-bit
 * exponent and the mantissa into a float32 whose exponent is too large by
 * 112 (so 31 lands on 255: Inf/NaN) and scale by 2^-112. Subnormals: place
 * the mantissa under the exponent of 0.5 and subtract 0.5. */
static inline float reduce_f16_to_f32(uint16_t h)
{
  uint32_t w = (uint32_t)h << 16;
  uint32_t sign = w & 0x80000000u;
  uint32_t two_w = w + w; /* drops the sign */
  float normal = reduce_f32_from_bits((two_w >> 4) + (0xE0u << 23)) * 0x1p-112f;
  float subnormal = reduce_f32_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
  /* A mask, not ?:, so that GCC does not turn the select into a branch
   * around a float operation (which -ftrapping-math then cannot if-convert). */
  uint32_t is_sub = (uint32_t)0 - (uint32_t)(two_w < (1u << 27));
  uint32_t bits = (reduce_f32_bits(subnormal) & is_sub) | (reduce_f32_bits(normal) & ~is_sub);
  return reduce_f32_from_bits(sign | bits);
}

/* float32 -> float16, round to nearest even (the FPU does the rounding). The
 * two scalings send |f| >= 65536 to Inf and otherwise leave |f| * 4. Adding
 * a power of two chosen from f's exponent (at least 2^-14 scaled likewise)
 * makes the float32 addition drop exactly the bits float16 cannot hold, with
 * the current (nearest-even) rounding mode; the float16 exponent and
 * mantissa are then read off the sum's bits. A rounding carry into the
 * exponent, or up to Inf, comes out right by itself. NaN -> quiet NaN. */
static inline uint16_t reduce_f32_to_f16(float f)
{
  uint32_t w = reduce_f32_bits(f);
  uint32_t shl1_w = w + w;
  uint32_t sign = w & 0x80000000u;
  float base = reduce_f32_from_bits(w & 0x7FFFFFFFu) * 0x1p+112f * 0x1p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias; /* subnormal results */
  base = reduce_f32_from_bits((bias >> 1) + 0x07800000u) + base;
  uint32_t bits = reduce_f32_bits(base);
  uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  uint32_t is_nan = (uint32_t)0 - (uint32_t)(shl1_w > 0xFF000000u); /* mask: see above */
  return (uint16_t)((sign >> 16) | (0x7E00u & is_nan) | (nonsign & ~is_nan));
}

/* bfloat16 is the top half of a float32. */
static inline float reduce_bf16_to_f32(uint16_t h)
{
  return reduce_f32_from_bits((uint32_t)h << 16);
}

/* float32 -> bfloat16, round to nearest even by adding 0x7FFF plus the lowest
 * kept bit; a carry into the exponent (up to Inf) is the right answer.
 * NaN needs no test here (a test would cost much of a 2-input bfloat16 sum;
 * bench/README.md, "Measurements behind the code"):
 * every value this file stores was computed from bfloat16 inputs, whose low
 * 16 bits are zero, and IEEE arithmetic on x86 and Arm returns either a NaN
 * operand (quieted: bit 22, payload kept) or the default NaN 0x?FC00000. So a
 * NaN here has zero low bits, the addition cannot carry into the top half,
 * and the NaN is stored unchanged. Do not use this for arbitrary floats. */
static inline uint16_t reduce_f32_to_bf16(float f)
{
  uint32_t u = reduce_f32_bits(f);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* ---- element operations ------------------------------------------------------ */

/* Truncating a / d for d > 0 given as size_t, without overflowing int64_t. */
static inline int64_t reduce_sdiv(int64_t a, size_t d)
{
  if ((uint64_t)d <= (uint64_t)INT64_MAX)
    return a / (int64_t)d;
  /* d >= 2^63 >= |a|: the quotient is 0, except INT64_MIN / 2^63 == -1. */
  return (a == INT64_MIN && (uint64_t)d == (uint64_t)INT64_MAX + 1u) ? -1 : 0;
}

/* Truncating a / d for |a| <= 2^31 and d > 0, in double so that it
 * vectorises (x86 has no vector integer division). Exact: a non-integer a/d
 * is at least 1/d away from an integer, while the division's rounding error
 * is below |a/d| * 2^-53 < 2^-22 / d; and d above 2^53 (inexact as double)
 * is still > |a|, giving 0 as it should. */
static inline int32_t reduce_sdiv32(int32_t a, size_t d)
{
  return (int32_t)((double)a / (double)d);
}

/* Integers wrap: add/multiply in the unsigned type of the same width, then
 * convert back (modulo 2^N in GCC/Clang, and no UB). 8-bit operands promote
 * to int, where 255 * 255 cannot overflow. */
#define REDUCE_I8_ADD(a, b) ((int8_t)(uint8_t)((uint8_t)(a) + (uint8_t)(b)))
#define REDUCE_I8_MUL(a, b) ((int8_t)(uint8_t)((uint8_t)(a) * (uint8_t)(b)))
#define REDUCE_I8_DIV(a, d) ((int8_t)reduce_sdiv32((a), (d)))
#define REDUCE_U8_ADD(a, b) ((uint8_t)((a) + (b)))
#define REDUCE_U8_MUL(a, b) ((uint8_t)((a) * (b)))
#define REDUCE_U8_DIV(a, d) ((uint8_t)reduce_sdiv32((a), (d)))
#define REDUCE_I32_ADD(a, b) ((int32_t)((uint32_t)(a) + (uint32_t)(b)))
#define REDUCE_I32_MUL(a, b) ((int32_t)((uint32_t)(a) * (uint32_t)(b)))
#define REDUCE_I32_DIV(a, d) (reduce_sdiv32((a), (d)))
#define REDUCE_I64_ADD(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define REDUCE_I64_MUL(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
#define REDUCE_I64_DIV(a, d) (reduce_sdiv((a), (d)))
/* Floats: plain IEEE arithmetic in the accumulator type. The divisor is
 * converted to that type (exact up to 2^24 for float32, 2^53 for float64). */
#define REDUCE_F_ADD(a, b) ((a) + (b))
#define REDUCE_F_MUL(a, b) ((a) * (b))
#define REDUCE_F32_DIV(a, d) ((a) / (float)(d))
#define REDUCE_F64_DIV(a, d) ((a) / (double)(d))
#define REDUCE_SAME(x) (x)

/*
 * acc[i] = LOADL(xl[i]) op LOADR(xr[i]) for i < n, where xl is either the
 * first input or acc itself. The op switch sits outside the element loops,
 * so each loop is a plain vectorisable stream.
 *
 * MIN/MAX use `(v < a || v != v) ? v : a` (a: the left, earlier value; v:
 * the next input): a NaN from any input propagates, as NumPy's minimum and
 * MPI do. A NaN already in `a` stays (every comparison with it is false); a
 * NaN in `v` replaces `a`. Operands are folded in rank order, so every rank
 * keeps the same NaN, bit for bit. For integers `v != v` is false and
 * compiles away; for floats it is one unordered compare and a blend per
 * vector. Signed zeros: the earlier input wins a tie (min(-0, +0) is -0 when
 * -0 comes first, +0 when +0 does).
 */
#define REDUCE_COMBINE(op, A, acc, xl, LOADL, xr, LOADR, n, ADD, MUL)                     \
  switch (op) {                                                                          \
  case COLL_PROD:                                                                        \
    _Pragma("GCC ivdep") for (size_t i = 0; i < (n); i++)                                \
      (acc)[i] = MUL(LOADL((xl)[i]), LOADR((xr)[i]));                                    \
    break;                                                                               \
  case COLL_MIN:                                                                         \
    _Pragma("GCC ivdep") for (size_t i = 0; i < (n); i++) {                              \
      A a = LOADL((xl)[i]), v = LOADR((xr)[i]);                                          \
      (acc)[i] = (v < a || v != v) ? v : a;                                                          \
    }                                                                                    \
    break;                                                                               \
  case COLL_MAX:                                                                         \
    _Pragma("GCC ivdep") for (size_t i = 0; i < (n); i++) {                              \
      A a = LOADL((xl)[i]), v = LOADR((xr)[i]);                                          \
      (acc)[i] = (v > a || v != v) ? v : a;                                                          \
    }                                                                                    \
    break;                                                                               \
  default: /* COLL_SUM, COLL_AVG */                                                      \
    _Pragma("GCC ivdep") for (size_t i = 0; i < (n); i++)                                \
      (acc)[i] = ADD(LOADL((xl)[i]), LOADR((xr)[i]));                                    \
    break;                                                                               \
  }

/* One kernel per dtype: T is the stored type, A the accumulator type, LOAD
 * and STORE convert between them (for each element, inside the loops). The
 * first two inputs are combined in one pass (acc = in[0] op in[1]), which
 * makes the common 2-input case faster than copying in[0] first; not for
 * the 16-bit floats, where GCC 12 then picks narrower vectors and the fused
 * pass is slower than two simple ones (bench/README.md, "Measurements behind
 * the code"). */
#define REDUCE_KERNEL(name, T, A, LOAD, STORE, ADD, MUL, DIV)                             \
  static REDUCE_CLONES void name(coll_op_t op, void *out, const void *const *in,         \
                                 size_t nin, size_t count, size_t divisor)                \
  {                                                                                      \
    /* AVG of floats by a power of two: a multiplication by its reciprocal, the same  \
     * result as the division (both round the same exact value once), several times  \
     * cheaper per element (AVX-512 divides 16 floats in ~8 cycles, multiplies 32 in 1) */\
    int by_scale = op == COLL_AVG && (A)0.5 != 0 && (divisor & (divisor - 1)) == 0;       \
    A scale = by_scale ? (A)1 / (A)divisor : (A)1;                                        \
    if (nin == 2 && sizeof(T) == sizeof(A) && (op != COLL_AVG || by_scale)) {           \
      /* two inputs: one pass straight into out (ivdep: out may be in[0] or in[1]) */    \
      const T *x0 = (const T *)in[0], *x1 = (const T *)in[1];                           \
      T *y = (T *)out;                                                                   \
      if (by_scale) {                                                                    \
        _Pragma("GCC ivdep") for (size_t i = 0; i < count; i++)                          \
          y[i] = MUL(ADD(x0[i], x1[i]), scale);                                          \
        return;                                                                          \
      }                                                                                  \
      REDUCE_COMBINE(op, A, y, x0, REDUCE_SAME, x1, REDUCE_SAME, count, ADD, MUL)        \
      return;                                                                            \
    }                                                                                    \
    A acc[REDUCE_BLOCK];                                                                 \
    for (size_t base = 0; base < count; base += REDUCE_BLOCK) {                          \
      size_t n = count - base < REDUCE_BLOCK ? count - base : REDUCE_BLOCK;              \
      const T *x0 = (const T *)in[0] + base;                                             \
      size_t k = 1;                                                                      \
      if (nin == 1 || sizeof(T) != sizeof(A)) {                                          \
        for (size_t i = 0; i < n; i++)                                                   \
          acc[i] = LOAD(x0[i]);                                                          \
      } else {                                                                           \
        const T *x1 = (const T *)in[1] + base;                                           \
        REDUCE_COMBINE(op, A, acc, x0, LOAD, x1, LOAD, n, ADD, MUL)                      \
        k = 2;                                                                           \
      }                                                                                  \
      for (; k < nin; k++) {                                                             \
        const T *x = (const T *)in[k] + base;                                            \
        REDUCE_COMBINE(op, A, acc, acc, REDUCE_SAME, x, LOAD, n, ADD, MUL)               \
      }                                                                                  \
      if (by_scale) {                                                                    \
        for (size_t i = 0; i < n; i++)                                                   \
          acc[i] = MUL(acc[i], scale);                                                   \
      } else if (op == COLL_AVG) {                                                       \
        for (size_t i = 0; i < n; i++)                                                   \
          acc[i] = DIV(acc[i], divisor);                                                 \
      }                                                                                  \
      T *y = (T *)out + base;                                                            \
      for (size_t i = 0; i < n; i++)                                                     \
        y[i] = STORE(acc[i]);                                                            \
    }                                                                                    \
  }

REDUCE_KERNEL(reduce_int8, int8_t, int8_t, REDUCE_SAME, REDUCE_SAME, REDUCE_I8_ADD,
              REDUCE_I8_MUL, REDUCE_I8_DIV)
REDUCE_KERNEL(reduce_uint8, uint8_t, uint8_t, REDUCE_SAME, REDUCE_SAME, REDUCE_U8_ADD,
              REDUCE_U8_MUL, REDUCE_U8_DIV)
REDUCE_KERNEL(reduce_int32, int32_t, int32_t, REDUCE_SAME, REDUCE_SAME, REDUCE_I32_ADD,
              REDUCE_I32_MUL, REDUCE_I32_DIV)
REDUCE_KERNEL(reduce_int64, int64_t, int64_t, REDUCE_SAME, REDUCE_SAME, REDUCE_I64_ADD,
              REDUCE_I64_MUL, REDUCE_I64_DIV)
REDUCE_KERNEL(reduce_float16, uint16_t, float, reduce_f16_to_f32, reduce_f32_to_f16,
              REDUCE_F_ADD, REDUCE_F_MUL, REDUCE_F32_DIV)
REDUCE_KERNEL(reduce_bfloat16, uint16_t, float, reduce_bf16_to_f32, reduce_f32_to_bf16,
              REDUCE_F_ADD, REDUCE_F_MUL, REDUCE_F32_DIV)
REDUCE_KERNEL(reduce_float32, float, float, REDUCE_SAME, REDUCE_SAME, REDUCE_F_ADD,
              REDUCE_F_MUL, REDUCE_F32_DIV)
REDUCE_KERNEL(reduce_float64, double, double, REDUCE_SAME, REDUCE_SAME, REDUCE_F_ADD,
              REDUCE_F_MUL, REDUCE_F64_DIV)

typedef void (*reduce_kernel_fn)(coll_op_t op, void *out, const void *const *in, size_t nin,
                                 size_t count, size_t divisor);

/* ---- float16 with hardware conversion ------------------------------------ */
/* GCC 12 does not vectorise _Float16 conversions, and the bit tricks above
 * cost some 15 instructions per vector each way, which makes float16 several
 * times slower than bfloat16. F16C (on every AVX2 CPU) and AVX-512F (KNL
 * too) convert 8 or 16 values per instruction, rounding to nearest even by
 * immediate (not MXCSR; FTZ/DAZ do not matter). Each input block is converted
 * into `tmp`, then combined by the same float loops as everywhere else. The
 * result is bitwise that of the portable kernel except for NaN payloads
 * (hardware keeps their top bits, the portable store writes 0x7E00); all
 * ranks of a node run the same code, so they still agree bit for bit. */
#ifdef REDUCE_F16_HW

/* Convert n values, W per instruction; the n % W at the end of the last
 * block go through one zero-padded vector so they round the same way. */
#define REDUCE_F16_HW_CVT(name, TARGET, W, IN, OUT)                                      \
  static inline __attribute__((target(TARGET))) void name##_in(float *dst,               \
                                                               const uint16_t *src,      \
                                                               size_t n)                 \
  {                                                                                      \
    size_t i = 0;                                                                        \
    for (; i + (W) <= n; i += (W))                                                       \
      IN(dst + i, src + i);                                                              \
    if (i < n) {                                                                         \
      uint16_t h[W] = {0};                                                               \
      float f[W];                                                                        \
      memcpy(h, src + i, (n - i) * sizeof *src);                                         \
      IN(f, h);                                                                          \
      memcpy(dst + i, f, (n - i) * sizeof *dst);                                         \
    }                                                                                    \
  }                                                                                      \
  static inline __attribute__((target(TARGET))) void name##_out(uint16_t *dst,           \
                                                                const float *src,        \
                                                                size_t n)                \
  {                                                                                      \
    size_t i = 0;                                                                        \
    for (; i + (W) <= n; i += (W))                                                       \
      OUT(dst + i, src + i);                                                             \
    if (i < n) {                                                                         \
      uint16_t h[W];                                                                     \
      float f[W] = {0};                                                                  \
      memcpy(f, src + i, (n - i) * sizeof *src);                                         \
      OUT(h, f);                                                                         \
      memcpy(dst + i, h, (n - i) * sizeof *dst);                                         \
    }                                                                                    \
  }

/* One vector: W float16 at h <-> W float32 at f. */
#define REDUCE_F16C_IN(f, h)                                                              \
  _mm256_storeu_ps((f), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h))))
#define REDUCE_F16C_OUT(h, f)                                                             \
  _mm_storeu_si128((__m128i *)(h), _mm256_cvtps_ph(_mm256_loadu_ps(f),                    \
                                                   _MM_FROUND_TO_NEAREST_INT))
#define REDUCE_AVX512_IN(f, h)                                                            \
  _mm512_storeu_ps((f), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h))))
#define REDUCE_AVX512_OUT(h, f)                                                           \
  _mm256_storeu_si256((__m256i *)(h), _mm512_cvtps_ph(_mm512_loadu_ps(f),                 \
                                                      _MM_FROUND_TO_NEAREST_INT |         \
                                                          _MM_FROUND_NO_EXC))

REDUCE_F16_HW_CVT(reduce_f16c, "avx2,f16c", 8, REDUCE_F16C_IN, REDUCE_F16C_OUT)
REDUCE_F16_HW_CVT(reduce_avx512, "avx512f", 16, REDUCE_AVX512_IN, REDUCE_AVX512_OUT)

#define REDUCE_F16_HW_KERNEL(name, TARGET, CVT)                                           \
  static __attribute__((target(TARGET))) void name(coll_op_t op, void *out,              \
                                                   const void *const *in, size_t nin,    \
                                                   size_t count, size_t divisor)         \
  {                                                                                      \
    float acc[REDUCE_BLOCK], tmp[REDUCE_BLOCK];                                          \
    for (size_t base = 0; base < count; base += REDUCE_BLOCK) {                          \
      size_t n = count - base < REDUCE_BLOCK ? count - base : REDUCE_BLOCK;              \
      CVT##_in(acc, (const uint16_t *)in[0] + base, n);                                  \
      for (size_t k = 1; k < nin; k++) {                                                 \
        CVT##_in(tmp, (const uint16_t *)in[k] + base, n);                                \
        REDUCE_COMBINE(op, float, acc, acc, REDUCE_SAME, tmp, REDUCE_SAME, n,            \
                       REDUCE_F_ADD, REDUCE_F_MUL)                                        \
      }                                                                                  \
      if (op == COLL_AVG && (divisor & (divisor - 1)) == 0) { /* as REDUCE_KERNEL */    \
        for (size_t i = 0; i < n; i++)                                                   \
          acc[i] *= 1.0f / (float)divisor;                                               \
      } else if (op == COLL_AVG) {                                                       \
        for (size_t i = 0; i < n; i++)                                                   \
          acc[i] = REDUCE_F32_DIV(acc[i], divisor);                                      \
      }                                                                                  \
      CVT##_out((uint16_t *)out + base, acc, n);                                         \
    }                                                                                    \
  }

REDUCE_F16_HW_KERNEL(reduce_float16_f16c, "avx2,f16c", reduce_f16c)
REDUCE_F16_HW_KERNEL(reduce_float16_avx512, "avx512f", reduce_avx512)
#endif /* REDUCE_F16_HW */

/* The float16 kernel for this CPU. __builtin_cpu_supports reads a table
 * libgcc fills at startup; its "avx512f" and "avx2" also check that the OS
 * saves the vector registers ("f16c" alone does not, GCC bug 105920). */
static reduce_kernel_fn reduce_float16_kernel(void)
{
#ifdef REDUCE_F16_HW
  if (__builtin_cpu_supports("avx512f"))
    return reduce_float16_avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
    return reduce_float16_f16c;
#endif
  return reduce_float16;
}

static const reduce_kernel_fn reduce_kernels[COLL_DTYPE_COUNT] = {
    [COLL_INT8] = reduce_int8,           [COLL_UINT8] = reduce_uint8,
    [COLL_INT32] = reduce_int32,         [COLL_INT64] = reduce_int64,
    [COLL_FLOAT16] = reduce_float16,     [COLL_BFLOAT16] = reduce_bfloat16,
    [COLL_FLOAT32] = reduce_float32,     [COLL_FLOAT64] = reduce_float64,
};

/* ---- entry points ----------------------------------------------------------- */

/* Arguments are checked before the count == 0 shortcut, so a bad call fails
 * the same way whatever its size; pointers only matter when count > 0. A zero
 * divisor is only an error for COLL_AVG (other ops ignore it). */
int coll_reduce_local(coll_dtype_t dtype, coll_op_t op, void *out, const void *const *inputs,
                      size_t ninputs, size_t count, size_t divisor)
{
  if (!reduce_dtype_valid(dtype) || !reduce_op_valid(op) || ninputs == 0)
    return COLL_EBADARG;
  if (op == COLL_AVG && divisor == 0)
    return COLL_EBADARG;
  if (count == 0)
    return 0;
  if (out == NULL || inputs == NULL)
    return COLL_EBADARG;
  for (size_t k = 0; k < ninputs; k++) {
    if (inputs[k] == NULL)
      return COLL_EBADARG;
  }
  reduce_kernel_fn kernel = reduce_kernels[dtype];
  if (dtype == COLL_FLOAT16)
    kernel = reduce_float16_kernel();
  kernel(op, out, inputs, ninputs, count, divisor);
  return 0;
}

/* ---- accumulate: y += alpha * x (the memory servers') ------------------------- */

#define AXPY_LOOP(T, LOAD, STORE)                                                    \
  do {                                                                               \
    T *restrict yy = y;                                                              \
    const T *restrict xx = x;                                                        \
    for (size_t i = 0; i < count; i++) yy[i] = STORE(LOAD(yy[i]) + a * LOAD(xx[i])); \
  } while (0)
#define AXPY_SAME(v) (v)

/* y[0..count) += alpha * x[0..count), in float32 for the 16-bit floats (as the reduce kernels)
 * and in float64 for float64; int32 and int64 take a whole alpha and wrap (exact); y and x
 * apart. COLL_EBADARG for other dtypes, or an integer dtype with a fractional alpha. */
int coll__axpy(coll_dtype_t dtype, void *y, const void *x, double alpha, size_t count)
{
  if (count && (y == NULL || x == NULL))
    return COLL_EBADARG;
  if (dtype == COLL_FLOAT32) {
    float a = (float)alpha;
    AXPY_LOOP(float, AXPY_SAME, AXPY_SAME);
  } else if (dtype == COLL_FLOAT64) {
    double a = alpha;
    AXPY_LOOP(double, AXPY_SAME, AXPY_SAME);
  } else if (dtype == COLL_BFLOAT16) {
    float a = (float)alpha;
    AXPY_LOOP(uint16_t, reduce_bf16_to_f32, reduce_f32_to_bf16);
  } else if (dtype == COLL_FLOAT16) {
    float a = (float)alpha;
    AXPY_LOOP(uint16_t, reduce_f16_to_f32, reduce_f32_to_f16);
  } else if (dtype == COLL_INT32 && alpha == (double)(int64_t)alpha) {
    int64_t a = (int64_t)alpha;
    int32_t *restrict yy = y;
    const int32_t *restrict xx = x;
    for (size_t i = 0; i < count; i++) yy[i] = (int32_t)(uint32_t)((uint64_t)yy[i] + (uint64_t)(a * xx[i])); /* wraps */
  } else if (dtype == COLL_INT64 && alpha >= -0x1p63 && alpha < 0x1p63 && alpha == (double)(int64_t)alpha) {
    uint64_t a = (uint64_t)(int64_t)alpha; /* in uint64: wraps, as int32's does, without overflow UB */
    int64_t *restrict yy = y;
    const int64_t *restrict xx = x;
    for (size_t i = 0; i < count; i++) yy[i] = (int64_t)((uint64_t)yy[i] + a * (uint64_t)xx[i]);
  } else {
    return COLL_EBADARG;
  }
  return 0;
}
