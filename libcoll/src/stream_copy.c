/*
 * stream_copy.c - how the algorithms copy large data: coll__copy() picks
 * streaming stores (above a size the caller decides), `rep movsb` (from
 * HBMCOLL_REP_MOVSB_MIN, see below) or memcpy.
 *
 * Streaming stores bypass the caches (non-temporal).
 * A large result written with ordinary stores costs three memory transfers
 * per line: the line is first read (read for ownership), then written back.
 * Streaming stores skip the read and do not evict what the caches hold, so a
 * message far larger than the caches moves a third less data. For data that
 * is read again soon (a slot a peer reads next round, a message that fits in
 * cache) they are slower, which is why callers use them only above a size.
 * They are weakly ordered: a caller calls coll__stream_fence() after its
 * last streaming copy and before it publishes the flag that says the data
 * is there. (A fence after every copy would wait for each copy's stores to
 * reach memory before the next could start.)
 */
#include <stdlib.h>
#include <string.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#include "internal.h"

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
 * loop from the L2 size up on AMD, because string moves were slow on the
 * first Zen cores. Where the CPU advertises fast string moves (FSRM: Zen 3+,
 * Ice Lake+) `rep movsb` measured faster from there on (EPYC VM, 2 cores
 * copying at once, 16 rotating buffers: 1 MiB 29-46 us against 38-65 for
 * memcpy; 1 MiB gather, medians of 15: 159 -> 143 us), so copies from
 * HBMCOLL_REP_MOVSB_MIN bytes (default 1 MiB there, never elsewhere) use it.
 */
int coll__cpu_fast_strings(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
  return (b >> 9 & 1) && (d >> 4 & 1); /* ERMS and FSRM */
#else
  return 0;
#endif
}

static void copy_rep_movsb(void *dst, const void *src, size_t n) {
#if defined(__SANITIZE_ADDRESS__) /* ASan sees memcpy, not an instruction: check as it would */
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

void coll__copy(const coll_comm_t *c, void *dst, const void *src, size_t n, int stream) {
  if (stream) coll__copy_stream(dst, src, n);
  else if (n >= c->params.rep_movsb_min) copy_rep_movsb(dst, src, n);
  else memcpy(dst, src, n);
}
