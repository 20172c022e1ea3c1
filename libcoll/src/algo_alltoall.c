/*
 * algo_alltoall.c - block q of rank r's send goes to block r of rank q's recv.
 *
 * Each round every rank stages the next piece (slot/P bytes) of each of its
 * outgoing blocks side by side in its slot, publishes, waits for all, and
 * copies its piece out of every peer's slot. In place works: chunk k of
 * every block is staged before chunk k of the receive side is written.
 */
#include <string.h>

#include "coll_internal.h"

int coll__alltoall(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  size_t piece = (c->hdr->slot_bytes / (size_t)c->size) & ~(size_t)63;
  uint64_t K = nbytes ? coll__div_up(nbytes, piece) : 1;
  int me = c->rank, rc;
  const uint8_t *send = a->send;
  uint8_t *recv = a->recv;
  uint64_t t0 = coll__begin(c, a, 0, 0);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    int p;
    if ((rc = coll__slot_acquire(c, t, &p)) != 0) return rc;
    size_t off = k * piece, len = coll__min(piece, nbytes - off);
    uint8_t *slot = coll__slot(c, me, p);
    for (int q = 0; q < c->size && len; q++)
      if (q != me) memcpy(slot + (size_t)q * piece, send + (size_t)q * nbytes + off, len);
    coll__publish_arrive(c, t);
    coll__slot_release(c, p, t, -1);
    for (int i = 1; i < c->size; i++) {
      int q = (me + i) % c->size;
      rc = k == 0 ? coll__meet(c, q, t0) : coll__wait_arrive(c, q, t);
      if (rc) return rc;
      if (len) memcpy(recv + (size_t)q * nbytes + off, coll__slot(c, q, p) + (size_t)me * piece, len);
    }
    if (len && recv != send) memmove(recv + (size_t)me * nbytes + off, send + (size_t)me * nbytes + off, len);
    coll__publish_done(c, t);
  }
  c->round = t0 + K - 1;
  return 0;
}
