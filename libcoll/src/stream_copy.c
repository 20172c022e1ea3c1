/*
 * stream_copy.c - copies that bypass the caches (non-temporal stores).
 *
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
#include <string.h>

#include "internal.h"

#if defined(__x86_64__)
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

void coll__copy(void *dst, const void *src, size_t n, int stream) {
  if (stream) coll__copy_stream(dst, src, n);
  else memcpy(dst, src, n);
}
