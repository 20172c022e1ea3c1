/*
 * algo_bcast.c - broadcast from the root.
 *
 * Private buffers ("eager" up to HBMCOLL_SMALL_MAX, "pipelined" above; the same rounds):
 * up to COLL_INLINE_MAX bytes ride in the root's descriptor (round.h), else
 * the root copies the message through its two staging slots, one slot-sized
 * chunk per round (t0 .. t0+K-1), the first staged before its descriptor is
 * published, and returns; receivers compare every descriptor at t0, copy each
 * chunk out and publish `done`, which lets the root refill that slot two rounds
 * on. Copy-in of chunk k+1 overlaps copy-out of chunk k, and the root's next
 * call overlaps the receivers' copy of this one. The root learns of a
 * disagreement at its next call (round.h: coll__round_unchecked). K >= 1 even
 * for an empty message so the round count never depends on the data.
 * Otherwise, round t0: every rank publishes its descriptor and compares them
 * all, the root before any data moves:
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

/* The root's side of a staged bcast: chunk 0 staged before the descriptor, so one
 * publication at t0 carries both, then chunk k at t0+k through the two slots (each refilled
 * once every receiver finished the round two before). It returns without waiting for the
 * receivers, as an MPI eager send does: their descriptors are compared at its next call
 * (coll__round_unchecked). */
static int bcast_give(coll_comm_t *c, const coll_args_t *a, size_t nbytes, int algo) {
  size_t chunk = coll__slot_bytes(c);
  uint64_t K = nbytes ? coll__div_up(nbytes, chunk) : 1, t0 = coll__round_next(c);
  const uint8_t *buf = a->recv;
  uint8_t *slot;
  int rc;
  if (coll__inline(nbytes)) { /* in my descriptor: K = 1 */
    coll__round_begin(c, a, algo, 0, 0);
    if ((rc = coll__post_inline(c, t0, buf, nbytes, -1)) != 0) return rc;
    coll__round_unchecked(c, t0);
    coll__round_end(c, t0);
    return 0;
  }
  if ((rc = coll__stage(c, t0, &slot)) != 0) return rc;
  if (nbytes) coll__stage_copy(c, slot, buf, coll__min(chunk, nbytes));
  coll__round_begin(c, a, algo, 0, 0);
  coll__publish_staged(c, t0, -1, t0);
  coll__round_unchecked(c, t0);
  coll__round_end(c, t0 + K - 1);
  for (uint64_t k = 1; k < K; k++) {
    size_t off = k * chunk; /* chunk 2 on compares first (coll__stage) */
    if ((rc = coll__post(c, t0 + k, buf + off, coll__min(chunk, nbytes - off), -1)) != 0) return rc;
  }
  return 0;
}

/* A receiver's side of it, after meeting every rank at t0. */
static int bcast_take(coll_comm_t *c, const coll_args_t *a, size_t nbytes, uint64_t t0) {
  size_t chunk = coll__slot_bytes(c);
  uint64_t K = nbytes ? coll__div_up(nbytes, chunk) : 1;
  int root = a->root, rc, stream = nbytes >= coll__stream_min(c); /* my copy is written once */
  uint8_t *buf = a->recv;
  coll__round_end(c, t0 + K - 1);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    if (k && (rc = coll__wait(c, root, t)) != 0) return rc;
    size_t off = k * chunk, len = coll__min(chunk, nbytes - off);
    if (coll__inline(nbytes)) memcpy(buf, coll__peer_inline(c, root), nbytes);
    else if (len) coll__copy(c, buf + off, coll__peer_slot(c, root, t), len, stream);
    /* the root refills this slot two rounds on; for the last chunk my next arrival says I
     * am done (round.h), one publication fewer on the line the root polls */
    if (k + 1 < K) coll__finish(c, t);
  }
  if (stream) coll__stream_fence();
  return 0;
}

/* The root's buffer in the shared arena, or single copy: receivers copy straight from it at
 * t0+1, and the root returns only when all have finished reading, since the caller may
 * then change it. */
static int bcast_direct_root(coll_comm_t *c, const coll_args_t *a, uint64_t zoff, int single) {
  uint64_t t0 = coll__round_begin(c, a, BC_PIPELINED, zoff, 0);
  if (single) coll__round_single_copy(c);
  c->algorithm = single ? "single-copy" : "arena";
  coll__publish(c, t0);
  int rc = coll__meet_all(c, t0);
  if (rc) return rc;
  coll__publish(c, t0 + 1);
  coll__round_end(c, t0 + 1);
  return coll__wait_all_finished(c, t0 + 1);
}

static int bcast_direct_take(coll_comm_t *c, const coll_args_t *a, size_t nbytes, uint64_t t0) {
  int root = a->root, rc, stream = nbytes >= coll__stream_min(c);
  const coll__desc_t *d = coll__peer_desc(c, root);
  uint64_t root_off = d->send_off;
  c->algorithm = d->single_copy ? "single-copy" : "arena";
  coll__round_end(c, t0 + 1);
  if ((rc = coll__wait(c, root, t0 + 1)) != 0) return rc;
  if (!d->single_copy) coll__copy(c, a->recv, coll__shared(c, root_off), nbytes, stream);
  else if ((rc = coll__peer_copy(c, root, a->recv, root_off, nbytes, 0)) != 0) return rc;
  if (stream) coll__stream_fence();
  coll__finish(c, t0 + 1);
  return 0;
}

int coll__bcast(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  int small = nbytes <= coll__small_max(c) && nbytes <= coll__slot_bytes(c);
  c->algorithm = "tree";
  if (coll__tree_wanted(c, COLL_BCAST, small)) return coll__bcast_tree(c, a);
  c->algorithm = small ? "eager" : "pipelined";
  int algo = small ? BC_EAGER : BC_PIPELINED;
  if (c->rank == a->root) {
    if (!small && coll__forced_algo(c, COLL_BCAST) != coll__algo_id(COLL_BCAST, "flat")) {
      uint64_t zoff = coll__arena_offset(c, a->recv, nbytes);
      int single = !zoff && coll__single_copy_from(c, COLL_BCAST, nbytes);
      if (zoff || single) return bcast_direct_root(c, a, zoff ? zoff : (uint64_t)(uintptr_t)a->recv, single);
    }
    return bcast_give(c, a, nbytes, algo);
  }
  /* every descriptor compared here, the root's included: a receiver that finishes has met
   * every rank at t0 (round.c), and the root's says how it sends */
  uint64_t t0 = coll__round_begin(c, a, algo, 0, 0);
  coll__publish(c, t0);
  int rc = coll__meet_all(c, t0);
  if (rc) return rc;
  return coll__peer_desc(c, a->root)->send_off ? bcast_direct_take(c, a, nbytes, t0)
                                                : bcast_take(c, a, nbytes, t0);
}
