/*
 * collective.c - the dispatcher: argument checks, a private copy of a send buffer that
 * partly overlaps the receive buffer, and the algorithm of each kind (algo_*.c, written on
 * the round layer, round.h). Blocking and nonblocking entry points are request.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms.h"
#include "coll_internal.h"
#include "round.h"

static int coll_uses_op(coll_kind_t k) {
  return k == COLL_REDUCE || k == COLL_ALLREDUCE || k == COLL_REDUCE_SCATTER;
}
static int coll_uses_root(coll_kind_t k) {
  return k == COLL_BCAST || k == COLL_GATHER || k == COLL_SCATTER || k == COLL_REDUCE;
}

int coll__check_args(const coll_comm_t *c, const coll_args_t *a) {
  if ((unsigned)a->kind >= COLL_KIND_COUNT || (unsigned)a->dtype >= COLL_DTYPE_COUNT)
    return COLL_EBADARG;
  if (coll_uses_op(a->kind) && (unsigned)a->op >= COLL_OP_COUNT) return COLL_EBADARG;
  if (coll_uses_root(a->kind) && (a->root < 0 || a->root >= c->size)) return COLL_EBADARG;
  size_t es = coll_dtype_size(a->dtype);
  if (a->count > SIZE_MAX / es / (size_t)c->size) return COLL_EBADARG;
  if (a->count == 0 || a->kind == COLL_BARRIER) return 0;
  int is_root = a->root == c->rank;
  int need_send = a->kind != COLL_BCAST && !(a->kind == COLL_SCATTER && !is_root);
  int need_recv = a->kind == COLL_BCAST || !((a->kind == COLL_GATHER || a->kind == COLL_REDUCE) && !is_root);
  if ((need_send && a->send == NULL) || (need_recv && a->recv == NULL)) return COLL_EBADARG;
  return 0;
}

static int coll_dispatch(coll_comm_t *c, const coll_args_t *a) {
  c->algorithm = "pipelined"; /* scatter and the exchanges have one; the others say which (logs) */
  switch (a->kind) {
  case COLL_BARRIER: return coll__barrier(c, a);
  case COLL_BCAST: return coll__bcast(c, a);
  case COLL_GATHER: return coll__gather(c, a);
  case COLL_SCATTER: return coll__scatter(c, a);
  case COLL_ALLGATHER: return coll__allgather(c, a);
  case COLL_REDUCE:
  case COLL_ALLREDUCE: return coll__allreduce(c, a);
  case COLL_REDUCE_SCATTER: return coll__reduce_scatter(c, a);
  case COLL_ALLTOALL: return coll__alltoall(c, a);
  default: return COLL_EBADARG;
  }
}

int coll__execute(coll_comm_t *c, const coll_args_t *a) {
  int rc = coll__aborted(c);
  if (rc == 0 && c->unchecked_seq) rc = coll__settle(c);
  /* a push I left early: my next descriptor goes to its descriptor's place (two by seq & 1)
   * only once every peer is done with it */
  if (rc == 0 && c->push_open_seq && c->seq > c->push_open_seq) {
    rc = coll__wait_all_finished(c, c->push_open_round);
    c->push_open_seq = 0;
  }
  if (rc) return rc;
  coll_args_t safe;
  void *copy;
  if ((rc = coll__unalias(c, a, &safe, &copy)) < 0) /* the peers are already waiting for me */
    return coll__fail(c, rc, "rank %d: no memory for a private copy of its send buffer, which "
                      "partly overlaps the receive buffer; the communicator is closed", c->rank);
  rc = coll_dispatch(c, rc ? &safe : a);
  free(copy);
  return rc;
}
