/*
 * staged_floor.c - the least a P-rank allreduce of private buffers can cost on this machine,
 * with no library in the way (bench/workers/floor_worker.py loads it with ctypes).
 *
 * A rank's output depends on every element of its peers' inputs, and their private memory is
 * out of its reach, so the data must cross through shared memory: each rank writes there what
 * its peers need and reads what they wrote, besides reading its own input and writing its own
 * output (all the plain floor does). These kernels do exactly that, in three schedules (the
 * worker keeps the fastest at each size):
 *   rsag  (hbmcoll's above 16 KiB) per 256 KiB chunk, stage the slices my peers reduce, reduce
 *         my slice (my input + their staged slices) into my result slot, copy every result
 *         slice into my output;
 *   flat  (hbmcoll's up to 16 KiB, and with 2 ranks up to HBMCOLL_STREAM_MIN) per chunk,
 *         stage my whole chunk, then add every peer's staged chunk to my input into my output;
 *   rsag_nt  rsag with the copy-out in streaming stores (hbmcoll's from HBMCOLL_STREAM_MIN).
 * And gather (the least for a root with a private output: copy its own part, and every chunk
 * its peers staged, into that output), and bcast (the root stages each chunk, the others copy it
 * out, one chunk behind).
 * One "arrived" and one "done" flag per chunk, spinning, so what is read is the peers' fresh
 * writes; no descriptors, no checks, no wake-ups, float32 sum only.
 *
 * Shared memory (zeroed, the same on every rank): staged_floor_bytes(P) bytes.
 */
#define _POSIX_C_SOURCE 200809L
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#ifndef CHUNK
#define CHUNK (256 << 10)
#endif
enum { LINE = 64, MAXP = 256 };

typedef struct {
  _Alignas(LINE) _Atomic long arrived;
  _Alignas(LINE) _Atomic long done;
} flags_t;

size_t staged_floor_bytes(int P) {
  return (size_t)P * sizeof(flags_t) + (size_t)P * 2 * CHUNK;
}

static long round_no; /* this process's; every rank runs the same sequence of calls */

/* Spin until *f >= v; give up after about 10 s (a peer died): -1. After 16k polls, yield at
 * each: with more ranks than cores the peer needs this core. */
static int spin_until(_Atomic long *f, long v) {
  time_t give_up = 0;
  for (long i = 1; atomic_load_explicit(f, memory_order_acquire) < v; i++) {
    if (i > 16384) sched_yield();
    if ((i & 0xffff) == 0) { /* a clock read per 64k polls */
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      if (!give_up) give_up = t.tv_sec + 10;
      else if (t.tv_sec > give_up) return -1;
    }
  }
  return 0;
}

static void add(float *restrict r, const float *restrict a, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) r[i] = a[i] + b[i];
}

static void add_to(float *restrict r, const float *restrict b, size_t n) {
  for (size_t i = 0; i < n; i++) r[i] += b[i];
}

/* Copy with non-temporal stores (no read for ownership, caches left alone), as hbmcoll writes
 * outputs from HBMCOLL_STREAM_MIN on; the caller fences once per call. */
static void copy_nt(void *dst, const void *src, size_t n) {
#if defined(__x86_64__)
  char *d = dst;
  const char *s = src;
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)s + 1);
    __m128i c = _mm_loadu_si128((const __m128i *)s + 2), e = _mm_loadu_si128((const __m128i *)s + 3);
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)d + 1, b);
    _mm_stream_si128((__m128i *)d + 2, c);
    _mm_stream_si128((__m128i *)d + 3, e);
  }
  memcpy(d, s, n);
#else
  memcpy(dst, src, n);
#endif
}

static void fence_nt(void) {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

static size_t slice(int q, int P, size_t n) { /* 16 floats = one line */
  return q >= P ? n : (n * (size_t)q / (size_t)P) & ~(size_t)15;
}

/* One allreduce (sum) of n floats in rsag's schedule, the copy-out with streaming stores if nt.
 * 0, or -1 when a peer stopped answering. */
static int rsag(void *shared, int me, int P, const float *in, float *out, size_t n, int nt) {
  if (P < 1 || P > MAXP) return -1;
  flags_t *fl = shared;
  float *slots = (float *)((char *)shared + (size_t)P * sizeof(flags_t));
  size_t CE = CHUNK / sizeof(float), K = (n + CE - 1) / CE;
#define SLOT(q, p) (slots + ((size_t)(q) * 2 + (size_t)(p)) * CE)
  for (size_t k = 0; k <= K; k++) {
    long t = ++round_no;
    int p = (int)(t & 1);
    size_t off = k * CE, m = k < K ? (n - off < CE ? n - off : CE) : 0;
    size_t lo = slice(me, P, m), hi = slice(me + 1, P, m);
    if (k < K) {
      for (int q = 0; q < P; q++) /* everyone read my slot[p] of round t - 2 */
        if (q != me && spin_until(&fl[q].done, t - 1)) return -1;
      memcpy(SLOT(me, p), in + off, lo * sizeof(float));
      memcpy(SLOT(me, p) + hi, in + off + hi, (m - hi) * sizeof(float));
    }
    atomic_store_explicit(&fl[me].arrived, t, memory_order_release);
    for (int q = 0; q < P; q++)
      if (q != me && spin_until(&fl[q].arrived, t)) return -1;
    if (k < K && hi > lo && P == 1) memcpy(SLOT(me, p), in + off, m * sizeof(float));
    if (k < K && hi > lo && P > 1) { /* my slice: my input + every peer's staged copy of it */
      float *r = SLOT(me, p) + lo;
      add(r, in + off + lo, SLOT(me ? 0 : 1, p) + lo, hi - lo);
      for (int q = 2; q < P; q++) add_to(r, SLOT(q <= me ? q - 1 : q, p) + lo, hi - lo);
    }
    if (k >= 1) { /* every result slice of chunk k-1 into my output */
      int pj = (int)((t - 1) & 1);
      size_t offj = (k - 1) * CE, mj = n - offj < CE ? n - offj : CE;
      for (int q = 0; q < P; q++) {
        size_t a = slice(q, P, mj), b = slice(q + 1, P, mj);
        if (nt) copy_nt(out + offj + a, SLOT(q, pj) + a, (b - a) * sizeof(float));
        else memcpy(out + offj + a, SLOT(q, pj) + a, (b - a) * sizeof(float));
      }
    }
    atomic_store_explicit(&fl[me].done, t, memory_order_release);
  }
#undef SLOT
  if (nt) fence_nt();
  return 0;
}

int staged_floor_rsag(void *shared, int me, int P, const float *in, float *out, size_t n) {
  return rsag(shared, me, P, in, out, n, 0);
}

int staged_floor_rsag_nt(void *shared, int me, int P, const float *in, float *out, size_t n) {
  return rsag(shared, me, P, in, out, n, 1);
}

/* The same in flat's schedule. */
int staged_floor_flat(void *shared, int me, int P, const float *in, float *out, size_t n) {
  if (P < 1 || P > MAXP) return -1;
  flags_t *fl = shared;
  float *slots = (float *)((char *)shared + (size_t)P * sizeof(flags_t));
  size_t CE = CHUNK / sizeof(float), K = (n + CE - 1) / CE;
#define SLOT(q, p) (slots + ((size_t)(q) * 2 + (size_t)(p)) * CE)
  for (size_t k = 0; k < K; k++) {
    long t = ++round_no;
    int p = (int)(t & 1);
    size_t off = k * CE, m = n - off < CE ? n - off : CE;
    for (int q = 0; q < P; q++) /* everyone read my slot[p] of round t - 2 */
      if (q != me && spin_until(&fl[q].done, t - 1)) return -1;
    memcpy(SLOT(me, p), in + off, m * sizeof(float));
    atomic_store_explicit(&fl[me].arrived, t, memory_order_release);
    for (int q = 0; q < P; q++)
      if (q != me && spin_until(&fl[q].arrived, t)) return -1;
    if (P == 1) memcpy(out + off, in + off, m * sizeof(float));
    else add(out + off, in + off, SLOT(me ? 0 : 1, p), m);
    for (int q = 2; q < P; q++) add_to(out + off, SLOT(q <= me ? q - 1 : q, p), m);
    atomic_store_explicit(&fl[me].done, t, memory_order_release);
  }
#undef SLOT
  return 0;
}

static void copy_movsb(void *dst, const void *src, size_t bytes) {
#if defined(__x86_64__)
  __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(bytes) : : "memory");
#else
  memcpy(dst, src, bytes);
#endif
}

/* Gather of n floats from every rank into the root's out (P x n), rank order: the non-roots
 * stage chunk by chunk, the root copies its own part and each chunk of theirs: how = 0 with
 * memcpy, 1 its own part with `rep movsb` (faster from 1 MiB on some CPUs, slower on others),
 * 2 everything with streaming stores (as hbmcoll does for large outputs). */
int staged_floor_gather(void *shared, int me, int P, int root, int how, const float *in,
                        float *out, size_t n) {
  if (P < 1 || P > MAXP) return -1;
  flags_t *fl = shared;
  float *slots = (float *)((char *)shared + (size_t)P * sizeof(flags_t));
  size_t CE = CHUNK / sizeof(float), K = n ? (n + CE - 1) / CE : 1;
#define SLOT(q, p) (slots + ((size_t)(q) * 2 + (size_t)(p)) * CE)
  if (me == root && how == 1) copy_movsb(out + (size_t)me * n, in, n * sizeof(float));
  else if (me == root && how == 2) copy_nt(out + (size_t)me * n, in, n * sizeof(float));
  else if (me == root) memcpy(out + (size_t)me * n, in, n * sizeof(float));
  for (size_t k = 0; k < K; k++) {
    long t = ++round_no;
    int p = (int)(t & 1);
    size_t off = k * CE, m = n - off < CE ? n - off : CE;
    if (me != root) { /* my slot[p] of round t - 2 was read (by everyone, if it was an allreduce) */
      for (int q = 0; q < P; q++)
        if (q != me && spin_until(&fl[q].done, t - 1)) return -1;
      memcpy(SLOT(me, p), in + off, m * sizeof(float));
      atomic_store_explicit(&fl[me].arrived, t, memory_order_release);
    } else {
      for (int q = 0; q < P; q++) {
        if (q == me) continue;
        if (spin_until(&fl[q].arrived, t)) return -1;
        if (how == 2) copy_nt(out + (size_t)q * n + off, SLOT(q, p), m * sizeof(float));
        else memcpy(out + (size_t)q * n + off, SLOT(q, p), m * sizeof(float));
      }
    }
    atomic_store_explicit(&fl[me].done, t, memory_order_release);
  }
#undef SLOT
  if (how == 2) fence_nt();
  return 0;
}

/* Bcast of n floats from root's buf into every other rank's buf: the root stages chunk by chunk
 * into its two slots, the others copy each chunk out as it arrives (how as for gather). The root
 * reuses a slot once every rank has finished the round before it, so staging chunk k+1 overlaps
 * the copies of chunk k. */
int staged_floor_bcast(void *shared, int me, int P, int root, int how, float *buf, size_t n) {
  if (P < 1 || P > MAXP) return -1;
  flags_t *fl = shared;
  float *slots = (float *)((char *)shared + (size_t)P * sizeof(flags_t));
  size_t CE = CHUNK / sizeof(float), K = n ? (n + CE - 1) / CE : 1;
#define SLOT(q, p) (slots + ((size_t)(q) * 2 + (size_t)(p)) * CE)
  for (size_t k = 0; k < K; k++) {
    long t = ++round_no;
    int p = (int)(t & 1);
    size_t off = k * CE, m = n - off < CE ? n - off : CE;
    if (me == root) {
      for (int q = 0; q < P; q++) /* everyone read slot[p] of round t - 2 */
        if (q != me && spin_until(&fl[q].done, t - 2)) return -1;
      memcpy(SLOT(me, p), buf + off, m * sizeof(float));
      atomic_store_explicit(&fl[me].arrived, t, memory_order_release);
    } else {
      if (spin_until(&fl[root].arrived, t)) return -1;
      if (how == 1) copy_movsb(buf + off, SLOT(root, p), m * sizeof(float));
      else if (how == 2) copy_nt(buf + off, SLOT(root, p), m * sizeof(float));
      else memcpy(buf + off, SLOT(root, p), m * sizeof(float));
    }
    atomic_store_explicit(&fl[me].done, t, memory_order_release);
  }
#undef SLOT
  if (how == 2) fence_nt();
  return 0;
}
