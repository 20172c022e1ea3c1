/*
 * algo_reduce_scatter.c - rank r gets op over all ranks of block r ("flat").
 *
 * Each round every rank stages the next piece (slot/P bytes, whole elements)
 * of every block side by side, publishes, waits for all, and reduces its own
 * piece from all P slots in one P-way pass (ranks in order 0..P-1, so the
 * result does not depend on timing) straight into its receive buffer.
 */
#include <string.h>

#include "coll_internal.h"

int coll__reduce_scatter(coll_comm_t *c, const coll_args_t *a) {
  size_t es = coll_dtype_size(a->dtype);
  size_t nbytes = a->count * es;
  size_t piece = ((c->hdr->slot_bytes / (size_t)c->size) & ~(size_t)63) / es * es;
  uint64_t K = nbytes ? coll__div_up(nbytes, piece) : 1;
  int me = c->rank, P = c->size, rc;
  const uint8_t *send = a->send;
  uint8_t *recv = a->recv;
  const void *in[P];
  uint64_t t0 = coll__begin(c, a, 0, 0);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    int p;
    if ((rc = coll__slot_acquire(c, t, &p)) != 0) return rc;
    size_t off = k * piece, len = coll__min(piece, nbytes - off);
    uint8_t *slot = coll__slot(c, me, p);
    for (int q = 0; q < P && len; q++) memcpy(slot + (size_t)q * piece, send + (size_t)q * nbytes + off, len);
    coll__publish_arrive(c, t);
    coll__slot_release(c, p, t, -1);
    rc = k == 0 ? coll__meet_all(c, t0) : coll__wait_all_arrive(c, t);
    if (rc) return rc;
    for (int q = 0; q < P; q++) in[q] = coll__slot(c, q, p) + (size_t)me * piece;
    if (len) coll_reduce_local(a->dtype, a->op, recv + off, in, (size_t)P, len / es, (size_t)P);
    coll__publish_done(c, t);
  }
  c->round = t0 + K - 1;
  return 0;
}
