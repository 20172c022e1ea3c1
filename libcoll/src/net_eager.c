/*
 * net_eager.c - the bridge's eager path for small messages (net_ring_int.h): the small allgather
 * every call's meeting across nodes takes, one transfer each way per step and no credit, beside
 * the ring's slots-and-credits protocol (net_ring.c) that carries the large ones.
 */
#include <string.h>

#include "net_ring_int.h"

/* The small allgather, the eager path (Bruck's dissemination): W, the call's area of my pool,
 * holds at W[j] the block of member me + j. Step k (d = 2^k) writes W[0, min(d, n - d)) into
 * member me - d's W[d, ...) and waits for member me + d's write of the same into mine:
 * ceil(log2 n) steps where the ring takes n - 1, one transfer each way per step (2 nodes: one
 * in all). Only the first `used` bytes of the last block written go (the rest of a block is
 * the caller's don't-care; of my own block, in step 0, only `own`), so a small step fits the
 * provider's inject size and is injected:
 * nothing to wait for after it. The areas alternate between calls, and no credit is needed: a
 * member is at most one call ahead of any other (it cannot finish a call before everyone
 * started it, and it starts the next only after taking its blocks out of the area). My writes
 * that were not injected must have left an area before I fill it again, two calls later: by
 * then their completions came long ago, so that wait costs nothing. */
int coll__net_eager_allgather(coll__net_ring_t *r, uint8_t *buf, size_t block, size_t used, size_t own,
                              double timeout_s, char *err, size_t errlen) {
  size_t n = (size_t)r->n, me = (size_t)r->me;
  uint32_t call = r->hops++;
  size_t area = coll__net_hop_off(r, call);
  uint8_t *w = coll__net_pool(r->net) + area;
  coll__net_set_timeout(r->net, timeout_s);
  int rc = coll__net_ring_wait(r, RING_HOP_SENT, call, timeout_s, err, errlen);
  if (rc == 0) memcpy(w, buf + me * block, own);
  for (uint32_t k = 0, d = 1; rc == 0 && d < n; k++, d <<= 1) {
    size_t cnt = d < n - d ? d : n - d, len = d == 1 ? own : (cnt - 1) * block + used; /* step 0: my block alone */
    uint32_t step = (call * 8 + k) & RING_NUM;
    int peer = r->reach[(me + n - d) % n];
    if (len <= coll__net_inject_max(r->net)) {
      rc = coll__net_inject(r->net, peer, area, area + d * block, len, step | RING_HOP, err, errlen);
    } else {
      r->hop_staged[call & 1]++;
      rc = coll__net_write(r->net, peer, area, area + d * block, len, step | RING_HOP, &r->hop_sent[call & 1], err,
                           errlen);
    }
    if (rc == 0) rc = coll__net_ring_wait(r, RING_HOP_OF, step, timeout_s, err, errlen);
  }
  for (size_t j = 1; rc == 0 && j < n; j++) memcpy(buf + ((me + j) % n) * block, w + j * block, used);
  return rc;
}
