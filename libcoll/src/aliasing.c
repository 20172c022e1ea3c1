/*
 * aliasing.c - send and receive buffers that overlap in a way the algorithms
 * were not written for.
 *
 * Every algorithm reads `send` while it writes `recv` in pieces, so a send
 * buffer that partly overlaps the receive buffer would have input overwritten
 * before it was read (numpy views of one array, shifted, do this). The forms
 * each collective defines as "in place" are safe and cost nothing; any other
 * overlap runs on a private copy of the send buffer, taken when the
 * collective starts, so the result is what separate buffers would give.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"

static int al_overlap(const uint8_t *a, size_t na, const uint8_t *b, size_t nb) {
  return na && nb && a < b + nb && b < a + na;
}

/* The in-place forms of coll.h: the same buffer, or (gather, allgather) my
 * block of recv as send, (scatter, reduce_scatter) my block of send as recv. */
static int al_in_place(const coll_comm_t *c, const coll_args_t *a, size_t block) {
  const uint8_t *s = a->send, *r = a->recv;
  switch (a->kind) {
  case COLL_GATHER:
  case COLL_ALLGATHER: return s == r + (size_t)c->rank * block;
  case COLL_SCATTER: return r == s + (size_t)c->rank * block || r == s;
  case COLL_REDUCE_SCATTER: return r == s + (size_t)c->rank * block || r == s;
  default: return s == r;
  }
}

/* The bytes of send and recv this rank's call uses (0: none). */
static void al_extents(const coll_comm_t *c, const coll_args_t *a, size_t block, size_t *ns,
                       size_t *nr) {
  size_t all = block * (size_t)c->size;
  int root = a->root == c->rank;
  *ns = *nr = 0;
  switch (a->kind) {
  case COLL_GATHER: *ns = block, *nr = root ? all : 0; break;
  case COLL_ALLGATHER: *ns = block, *nr = all; break;
  case COLL_SCATTER: *ns = root ? all : 0, *nr = block; break;
  case COLL_REDUCE: *ns = block, *nr = root ? block : 0; break;
  case COLL_ALLREDUCE: *ns = *nr = block; break;
  case COLL_REDUCE_SCATTER: *ns = all, *nr = block; break;
  case COLL_ALLTOALL: *ns = *nr = all; break;
  default: break; /* barrier, bcast: one buffer or none */
  }
}

int coll__unalias(const coll_comm_t *c, const coll_args_t *a, coll_args_t *safe, void **copy) {
  *copy = NULL;
  if (a->send == NULL || a->recv == NULL) return 0;
  size_t block = a->count * coll_dtype_size(a->dtype), ns, nr;
  al_extents(c, a, block, &ns, &nr);
  if (!al_overlap(a->send, ns, a->recv, nr) || al_in_place(c, a, block)) return 0;
  if ((*copy = malloc(ns)) == NULL) return -ENOMEM;
  memcpy(*copy, a->send, ns);
  *safe = *a;
  safe->send = *copy;
  return 1;
}
