/*
 * algo_gather.c - gather to the root ("flat").
 *
 * Small messages take the eager path below, large ones single copy where the
 * kernel allows it (gather_single_copy). Otherwise each non-root copies its
 * contribution through its two staging slots, one
 * slot-sized chunk per round (t0 .. t0+K-1), and publishes its arrival; the
 * root compares every descriptor at t0, copies chunk k of every rank into
 * place and publishes `done`, which frees that slot for chunk k+2. Each
 * non-root also compares the root's descriptor at t0 (if every rank named
 * another rank as root, nobody would compare them all and all would wait for
 * ever). Non-roots finish by waiting for the root's last `done`: so they learn
 * of a disagreement the root found, and never return while the root still reads.
 * The root's own part is a local copy.
 *
 * Push: when the root's output lies in the shared arena (hbmcoll.empty) and
 * the message takes more than one chunk, its descriptor says where
 * (recv_off). Chunk 0 still goes through the slots (staged before anyone
 * knows), and the root's `done` for it, published only after it compared
 * every descriptor, is the "go": each other rank then copies the rest of its
 * part straight into the root's output and says so with one arrival (t0+1).
 * The copying is shared by all cores instead of done by the root alone.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

enum { GA_EAGER = 1, GA_PIPELINED = 2, GA_SINGLE_COPY = 3 };

/* Small messages (up to HBMCOLL_SMALL_MAX): everyone stages and publishes at
 * t0; the root compares every descriptor, copies and publishes `done` (which
 * frees the slots); the others return at once, as MPI's eager sends do, and
 * compare the descriptors at their next call (coll__round_unchecked). */
static int gather_eager(coll_comm_t *c, const coll_args_t *a, size_t nbytes) {
  int root = a->root, me = c->rank, rc;
  uint64_t t0 = coll__round_next(c);
  uint8_t *slot = NULL;
  int inl = coll__inline(nbytes); /* a part that fits rides in its rank's descriptor */
  if (me != root && inl) {
    coll__round_begin(c, a, GA_EAGER, 0, 0);
    coll__round_end(c, t0);
    if ((rc = coll__post_inline(c, t0, a->send, nbytes, root)) != 0) return rc;
    coll__round_unchecked(c, t0);
    return 0;
  }
  if (me != root) { /* staged before the descriptor: one publication carries both */
    if ((rc = coll__stage(c, t0, &slot)) != 0) return rc;
    if (nbytes) coll__stage_copy(c, slot, a->send, nbytes);
  }
  coll__round_begin(c, a, GA_EAGER, 0, 0);
  coll__round_end(c, t0);
  if (slot) {
    coll__publish_staged(c, t0, root, t0);
    coll__round_unchecked(c, t0);
    return 0;
  }
  coll__publish(c, t0);
  if ((rc = coll__meet_all(c, t0)) != 0) return rc;
  uint8_t *recv = a->recv;
  if (nbytes && recv + (size_t)me * nbytes != (const uint8_t *)a->send)
    memmove(recv + (size_t)me * nbytes, a->send, nbytes);
  for (int q = 0; q < c->size && nbytes; q++)
    if (q != me)
      memcpy(recv + (size_t)q * nbytes, inl ? coll__peer_inline(c, q) : coll__peer_slot(c, q, t0), nbytes);
  /* no `done`: my next arrival says it (round.h), before any sender may refill its slot */
  return 0;
}

/* Large messages where single copy works (cma.c): the root publishes its
 * output's address at t0 and, once it has compared every descriptor, says
 * "go" at t0+1; each other rank then writes its part straight into the
 * root's output with process_vm_writev while the root copies its own part,
 * and the root returns when all have written (`done` at t0+1). An output in
 * the arena is published as its offset instead, and written with plain copies. */
static int gather_single_copy(coll_comm_t *c, const coll_args_t *a, size_t nbytes) {
  int root = a->root, me = c->rank, rc;
  /* an output in the shared arena needs no kernel: the others copy into it as memory */
  uint64_t zoff = me == root ? coll__arena_offset(c, a->recv, nbytes * (size_t)c->size) : 0;
  uint64_t t0 = coll__round_begin(c, a, GA_SINGLE_COPY, 0, me == root ? (zoff ? zoff : (uintptr_t)a->recv) : 0);
  if (!zoff) coll__round_single_copy(c);
  else c->algorithm = "arena";
  coll__publish(c, t0);
  coll__round_end(c, t0 + 1);
  if (me == root) {
    if ((rc = coll__meet_all(c, t0)) != 0) return rc;
    uint8_t *mine = (uint8_t *)a->recv + (size_t)me * nbytes;
    coll__publish(c, t0 + 1);
    /* send is my block of the output or apart from it (aliasing.c) */
    if (mine != (const uint8_t *)a->send) coll__copy(c, mine, a->send, nbytes, 0); /* while the others write */
    return coll__wait_all_finished(c, t0 + 1);
  }
  if ((rc = coll__meet(c, root, t0)) != 0 || (rc = coll__wait(c, root, t0 + 1)) != 0)
    return rc;
  const coll__desc_t *d = coll__peer_desc(c, root);
  uint64_t dst = d->recv_off + (uint64_t)me * nbytes;
  if (!d->single_copy) {
    c->algorithm = "arena";
    coll__copy(c, coll__shared(c, dst), a->send, nbytes, 0);
  } else if ((rc = coll__peer_copy(c, root, (void *)a->send, dst, nbytes, 1)) != 0) {
    return rc;
  }
  coll__finish(c, t0 + 1);
  return 0;
}

int coll__gather(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  size_t chunk = coll__slot_bytes(c);
  int small = nbytes <= coll__small_max(c) && nbytes <= chunk;
  if (coll__tree_wanted(c, COLL_GATHER, small && nbytes * (size_t)(c->size - 1) <= chunk)) {
    c->algorithm = "tree";
    return coll__gather_tree(c, a);
  }
  int single = !small && coll__single_copy_from(c, COLL_GATHER, nbytes);
  c->algorithm = small ? "eager" : single ? "single-copy" : "pipelined";
  if (small) return gather_eager(c, a, nbytes);
  if (single) return gather_single_copy(c, a, nbytes);
  uint64_t K = nbytes ? coll__div_up(nbytes, chunk) : 1;
  int root = a->root, me = c->rank, rc = 0;
  const uint8_t *send = a->send;
  uint64_t push = me == root && K > 1 ? coll__arena_offset(c, a->recv, nbytes * (size_t)c->size) : 0;
  uint64_t t0 = coll__round_begin(c, a, GA_PIPELINED, 0, push);
  int stream = nbytes * (size_t)c->size >= coll__stream_min(c); /* the root's whole output */

  if (me != root) {
    for (uint64_t k = 0; k < K; k++) {
      size_t off = k * chunk;
      if ((rc = coll__post(c, t0 + k, send + off, coll__min(chunk, nbytes - off), root)) != 0) return rc;
      if (k == 0 && (rc = coll__meet(c, root, t0)) != 0) return rc;
      if (k == 0 && (push = coll__peer_desc(c, root)->recv_off) != 0) { /* the root's output is shared */
        if ((rc = coll__wait_finished(c, root, t0)) != 0) return rc; /* "go": all descriptors agree */
        coll__copy(c, coll__shared(c, push) + (size_t)me * nbytes + chunk, send + chunk, nbytes - chunk,
                   stream);
        if (stream) coll__stream_fence();
        coll__publish(c, t0 + 1);
        coll__round_end(c, t0 + 1);
        return 0;
      }
    }
    coll__round_end(c, t0 + K - 1);
    if ((rc = coll__wait_finished(c, root, t0 + K - 1)) != 0) return rc;
    return coll__validate(c, root);
  }

  coll__publish(c, t0);
  uint8_t *recv = a->recv;
  /* my own part; send is this block of recv or apart from it (aliasing.c); streamed
   * copies are fenced at the end */
  if (nbytes && recv + (size_t)me * nbytes != send) coll__copy(c, recv + (size_t)me * nbytes, send, nbytes, stream);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    size_t off = k * chunk, len = coll__min(chunk, nbytes - off);
    for (int i = 1; i < c->size; i++) {
      int q = (me + i) % c->size;
      rc = k == 0 ? coll__meet(c, q, t0) : coll__wait(c, q, t);
      if (rc) return rc;
      if (len) coll__copy(c, recv + (size_t)q * nbytes + off, coll__peer_slot(c, q, t), len, stream);
    }
    coll__finish(c, t);
    if (push) { /* the others write the rest themselves */
      rc = coll__wait_all(c, t0 + 1);
      break;
    }
  }
  if (stream) coll__stream_fence();
  coll__round_end(c, push ? t0 + 1 : t0 + K - 1);
  return rc;
}
