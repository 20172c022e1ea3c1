/*
 * algo_bcast.c - broadcast from the root.
 *
 * Small messages take the eager path below. Otherwise, round t0: every rank
 * publishes its descriptor; the root compares them all
 * before any data moves (so every rank gets the same verdict), the others
 * compare the root's. Then:
 *  - "flat": the root copies the message through its two staging slots, one
 *    slot-sized chunk per round (t0+1 .. t0+K); receivers copy each chunk out
 *    and publish `done`, which lets the root refill that slot two rounds on.
 *    Copy-in of chunk k+1 overlaps copy-out of chunk k. K >= 1 even for an
 *    empty message so the round count never depends on the data.
 *  - "arena": the root's buffer lives in the shared arena (hbmcoll.empty):
 *    receivers copy straight from it in one round, and the root returns only
 *    when all have finished reading, since the caller may then change it.
 *  - single copy (cma.c), from HBMCOLL_CMA_MIN up: the same, but receivers
 *    read the root's private buffer with process_vm_readv. One copy of the
 *    message per receiver instead of two, and the root copies nothing.
 * The root's descriptor says which one it chose (send_off != 0: arena, or
 * with single_copy its buffer's address), so receivers follow the root even
 * if a forced algorithm differs between ranks.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

enum { BC_EAGER = 1, BC_PIPELINED = 2 };

/* Small messages ("eager", up to HBMCOLL_SMALL_MAX): the root stages the data
 * and publishes it with its descriptor at t0; every rank compares every
 * descriptor at t0 and receivers copy at once. One synchronisation instead of
 * the pipelined path's handshake, and every rank still sees any disagreement
 * in the same call. */
static int bcast_eager(coll_comm_t *c, const coll_args_t *a, size_t nbytes) {
  int root = a->root, rc;
  uint8_t *buf = a->recv, *slot = NULL;
  uint64_t t0 = coll__round_next(c);
  if (c->rank == root) { /* staged before the descriptor: one publication carries both */
    if ((rc = coll__stage(c, t0, &slot)) != 0) return rc;
    if (nbytes) memcpy(slot, buf, nbytes);
  }
  coll__round_begin(c, a, BC_EAGER, 0, 0);
  if (slot) coll__publish_staged(c, t0, -1, t0);
  else coll__publish(c, t0);
  coll__round_end(c, t0);
  if ((rc = coll__meet_all(c, t0)) != 0) return rc;
  if (c->rank != root) {
    if (nbytes) memcpy(buf, coll__peer_slot(c, root, t0), nbytes);
    coll__finish(c, t0);
  }
  return 0;
}

int coll__bcast(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  size_t chunk = coll__slot_bytes(c);
  int small = nbytes <= coll__small_max(c) && nbytes <= chunk;
  c->algorithm = "tree";
  if (coll__tree_wanted(c, COLL_BCAST, small)) return coll__bcast_tree(c, a);
  c->algorithm = "eager";
  if (small) return bcast_eager(c, a, nbytes);
  c->algorithm = "pipelined"; /* or, as the root's descriptor says, from the arena or single copy */
  uint64_t K = nbytes ? coll__div_up(nbytes, chunk) : 1;
  int root = a->root, rc;
  uint8_t *buf = a->recv;
  uint64_t zoff = 0;
  int single = 0;
  if (c->rank == root && coll__forced_algo(c, COLL_BCAST) != coll__algo_id(COLL_BCAST, "flat")) {
    zoff = coll__arena_offset(c, buf, nbytes);
    single = !zoff && coll__single_copy_from(c, nbytes);
    if (single) zoff = (uint64_t)(uintptr_t)buf;
  }
  uint64_t t0 = coll__round_begin(c, a, BC_PIPELINED, zoff, 0);
  if (single) coll__round_single_copy(c);
  if (zoff) c->algorithm = single ? "single-copy" : "arena";
  coll__publish(c, t0);

  if (c->rank == root) {
    if ((rc = coll__meet_all(c, t0)) != 0) return rc;
    if (zoff) {
      coll__publish(c, t0 + 1);
      coll__round_end(c, t0 + 1);
      return coll__wait_all_finished(c, t0 + 1);
    }
    for (uint64_t k = 0; k < K; k++) {
      size_t off = k * chunk;
      if ((rc = coll__post(c, t0 + 1 + k, buf + off, coll__min(chunk, nbytes - off), -1)) != 0) return rc;
    }
    coll__round_end(c, t0 + K);
    return 0;
  }

  if ((rc = coll__meet(c, root, t0)) != 0) return rc;
  uint64_t root_off = coll__peer_desc(c, root)->send_off;
  if (root_off) c->algorithm = coll__peer_desc(c, root)->single_copy ? "single-copy" : "arena";
  int stream = nbytes >= coll__stream_min(c); /* my copy is written once */
  if (root_off) {
    if ((rc = coll__wait(c, root, t0 + 1)) != 0) return rc;
    if (!coll__peer_desc(c, root)->single_copy) coll__copy(c, buf, coll__shared(c, root_off), nbytes, stream);
    else if ((rc = coll__peer_copy(c, root, buf, root_off, nbytes, 0)) != 0) return rc;
    if (stream) coll__stream_fence();
    coll__finish(c, t0 + 1);
    coll__round_end(c, t0 + 1);
    return 0;
  }
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + 1 + k;
    if ((rc = coll__wait(c, root, t)) != 0) return rc;
    size_t off = k * chunk, len = coll__min(chunk, nbytes - off);
    if (len) coll__copy(c, buf + off, coll__peer_slot(c, root, t), len, stream);
    coll__finish(c, t);
  }
  if (stream) coll__stream_fence();
  coll__round_end(c, t0 + K);
  return 0;
}
