/*
 * stream_copy.c - how the algorithms copy large data: coll__copy() picks
 * streaming stores (above a size the caller decides), `rep movsb` (from
 * HBMCOLL_REP_MOVSB_MIN, see below) or memcpy.
 *
 * Streaming stores bypass the caches (non-temporal).
 * A large result written with ordinary stores costs three memory transfers
 * per line: the line is first read (read for ownership), then written back.
 * Streaming stores skip the read and do not evict what the caches hold, so a
 * message far larger than the caches moves a third less data. For data this
 * core reads again soon (a message that fits in cache) they are slower, which
 * is why callers use them only above a size. A chunk staged for another core
 * is another matter: read from memory it can beat the writer's cache, and
 * whether it does is measured per communicator (coll__stage_copy, stage_probe.c).
 * They are weakly ordered: a caller calls coll__stream_fence() after its
 * last streaming copy and before it publishes the flag that says the data
 * is there. (A fence after every copy would wait for each copy's stores to
 * reach memory before the next could start.)
 */
#include <stdlib.h>
#include <string.h>
#if defined(__SANITIZE_ADDRESS__)
#define HB_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) /* clang before 22 */
#define HB_ASAN 1
#endif
#endif
#ifndef HB_ASAN
#define HB_ASAN 0
#endif
#if HB_ASAN
#include <sanitizer/asan_interface.h>
#endif

#include "coll_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <emmintrin.h>

void coll__copy_stream(void *dst, const void *src, size_t n) {
  uint8_t *d = dst;
  const uint8_t *s = src;
  size_t head = (size_t)(-(uintptr_t)d & 15); /* to the first 16-byte boundary of dst */
  if (head > n) head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  memcpy(d, s, n);
}

void coll__stream_fence(void) { _mm_sfence(); }
#else
void coll__copy_stream(void *dst, const void *src, size_t n) { memcpy(dst, src, n); }
void coll__stream_fence(void) {}
#endif

/*
 * Large ordinary copies: glibc's memcpy (2.36) leaves `rep movsb` for a vector
 * loop from the L2 size up on AMD, because string moves were slow there: on
 * Zen 3 and 4 up to 20x slower when source and destination are misaligned to
 * each other (glibc bug 30994). On Zen 5 `rep movsb` measured faster from
 * there on (bench/README.md, "Measurements behind the code"), so copies
 * from HBMCOLL_REP_MOVSB_MIN bytes use it (default 1 MiB on AMD family 1Ah,
 * Zen 5, and later; off elsewhere, where it was not measured), and only when
 * source and destination sit at the same offset within a cache line, the
 * case it won (NumPy's large arrays start 16 bytes into a page; offsets that
 * differ by 4-15 bytes lost most of the gain even on Zen 5).
 */
int coll__cpu_rep_movsb_fast(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0, &a, &b, &c, &d)) return 0;
  int amd = b == 0x68747541 && d == 0x69746e65 && c == 0x444d4163; /* "AuthenticAMD" */
  if (!amd || !__get_cpuid(1, &a, &b, &c, &d)) return 0;
  unsigned family = (a >> 8 & 0xf) + ((a >> 8 & 0xf) == 0xf ? (a >> 20 & 0xff) : 0);
  if (family < 0x1a || !__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (b >> 9 & 1) && (d >> 4 & 1); /* ERMS and FSRM */
#else
  return 0;
#endif
}

static void copy_rep_movsb(void *dst, const void *src, size_t n) {
#if HB_ASAN /* ASan sees memcpy, not an instruction: check as it would */
  const void *bad = __asan_region_is_poisoned(dst, n);
  if (!bad) bad = __asan_region_is_poisoned((void *)src, n);
  if (bad) {
    __asan_describe_address((void *)bad);
    abort();
  }
#endif
#if defined(__x86_64__)
  __asm__ __volatile__("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
#else
  memcpy(dst, src, n);
#endif
}

void coll__stage_copy(const coll_comm_t *c, void *slot, const void *src, size_t n) {
  if (n < c->params.stage_stream_min) {
    memcpy(slot, src, n);
    return;
  }
  coll__copy_stream(slot, src, n);
  coll__stream_fence();
}

void coll__copy(const coll_comm_t *c, void *dst, const void *src, size_t n, int stream) {
  if (stream) coll__copy_stream(dst, src, n);
  else if (n >= c->params.rep_movsb_min && (((uintptr_t)dst - (uintptr_t)src) & 63) == 0)
    copy_rep_movsb(dst, src, n);
  else memcpy(dst, src, n);
}
