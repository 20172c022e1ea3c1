/*
 * algo_scatter.c - scatter from the root ("flat").
 *
 * Round t0 carries only descriptors; the root compares them all before any data moves.
 * Each later round the root fills its staging slot with the next piece (slot/P bytes,
 * 64-byte aligned) of every rank's block, side by side, and each rank copies its own
 * piece out and publishes `done`. The root's own block is a local copy, made after every
 * other block was staged, so the root's `recv` may lie anywhere in `send`
 * (recv == send + root*count in place, or recv == send).
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

int coll__scatter(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  size_t piece = (coll__slot_bytes(c) / (size_t)c->size) & ~(size_t)63;
  uint64_t K = nbytes ? coll__div_up(nbytes, piece) : 1;
  int root = a->root, me = c->rank, rc;
  uint64_t t0 = coll__round_begin(c, a, 0, 0, 0);
  coll__publish(c, t0);
  coll__round_end(c, t0 + K);

  if (me == root) {
    if ((rc = coll__meet_all(c, t0)) != 0) return rc;
    const uint8_t *send = a->send;
    for (uint64_t k = 0; k < K; k++) {
      uint8_t *slot;
      if ((rc = coll__stage(c, t0 + 1 + k, &slot)) != 0) return rc;
      size_t off = k * piece;
      coll__stage_pieces(slot, send, nbytes, piece, off, coll__min(piece, nbytes - off), c->size, me);
      coll__publish_staged(c, t0 + 1 + k, -1, t0 + 1 + k);
    }
    if (nbytes && (uint8_t *)a->recv != send + (size_t)me * nbytes)
      memmove(a->recv, send + (size_t)me * nbytes, nbytes);
    return 0;
  }

  if ((rc = coll__meet(c, root, t0)) != 0) return rc;
  uint8_t *recv = a->recv;
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + 1 + k;
    if ((rc = coll__wait(c, root, t)) != 0) return rc;
    size_t off = k * piece, len = coll__min(piece, nbytes - off);
    if (len) memcpy(recv + off, coll__peer_slot(c, root, t) + (size_t)me * piece, len);
    coll__finish(c, t);
  }
  return 0;
}
