/*
 * collective.c - the entry point of every collective: argument checks,
 * descriptors that let ranks catch disagreements before any data moves, and
 * dispatch to the algorithm files.
 *
 * Every collective starts at round t0 = (last round) + 1 with each rank's
 * descriptor (kind, dtype, count, op, root) written beside its flags. Each
 * algorithm makes some rank (the root, or everyone) compare all descriptors
 * at t0 before it publishes data others consume, and every rank waits on such
 * a rank before it completes. So either all ranks get their result or all
 * get COLL_EMISMATCH, and finishing collective s+1 anywhere implies that all
 * ranks finished s (what makes the two descriptor copies and the two slot
 * parities safe to reuse).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"

uint64_t coll__begin(coll_comm_t *c, const coll_args_t *a, uint64_t send_off, uint64_t recv_off) {
  return coll__begin_algo(c, a, 0, send_off, recv_off);
}

uint64_t coll__begin_algo(coll_comm_t *c, const coll_args_t *a, int algo, uint64_t send_off,
                          uint64_t recv_off) {
  c->seq++;
  coll__desc_t *d = &c->ctl[c->rank].desc[c->seq & 1];
  d->seq = c->seq;
  d->count = a->count;
  d->kind = a->kind;
  d->dtype = a->dtype;
  d->op = a->op;
  d->root = a->root;
  d->algo = algo;
  d->send_off = send_off;
  d->recv_off = recv_off;
  d->single_copy = 0;
  return c->round + 1;
}

static int coll_uses_op(coll_kind_t k) {
  return k == COLL_REDUCE || k == COLL_ALLREDUCE || k == COLL_REDUCE_SCATTER;
}
static int coll_uses_root(coll_kind_t k) {
  return k == COLL_BCAST || k == COLL_GATHER || k == COLL_SCATTER || k == COLL_REDUCE;
}

static int coll_describe(const coll__desc_t *d, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s(count=%llu, dtype=%s", coll_kind_name((coll_kind_t)d->kind),
                   (unsigned long long)d->count, coll_dtype_name((coll_dtype_t)d->dtype));
  if (coll_uses_op((coll_kind_t)d->kind))
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", coll_op_name((coll_op_t)d->op));
  if (coll_uses_root((coll_kind_t)d->kind))
    n += snprintf(buf + n, len - (size_t)n, ", root=%d", d->root);
  if (d->algo)
    n += snprintf(buf + n, len - (size_t)n, ", algorithm %d", d->algo);
  return n + snprintf(buf + n, len - (size_t)n, ")");
}

int coll__validate(coll_comm_t *c, int peer) {
  const coll__desc_t *mine = &c->ctl[c->rank].desc[c->seq & 1];
  const coll__desc_t *theirs = &c->ctl[peer].desc[c->seq & 1];
  coll_kind_t k = (coll_kind_t)mine->kind;
  int same = theirs->seq == mine->seq && theirs->kind == mine->kind &&
             theirs->dtype == mine->dtype && theirs->count == mine->count && theirs->algo == mine->algo &&
             (!coll_uses_op(k) || theirs->op == mine->op) &&
             (!coll_uses_root(k) || theirs->root == mine->root);
  if (same) return 0;
  char m[96], t[96];
  coll_describe(mine, m, sizeof m);
  coll_describe(theirs, t, sizeof t);
  return coll__fail(c, COLL_EMISMATCH, "ranks disagree in collective #%llu: rank %d called %s, rank %d called %s",
                    (unsigned long long)(mine->seq - c->extra_seq), c->rank, m, peer, t);
}

int coll__meet(coll_comm_t *c, int peer, uint64_t t0) {
  int rc = coll__wait_arrive(c, peer, t0);
  return rc ? rc : coll__validate(c, peer);
}

int coll__meet_all(coll_comm_t *c, uint64_t t0) {
  for (int k = 1; k < c->size; k++) {
    int rc = coll__meet(c, (c->rank + k) % c->size, t0);
    if (rc) return rc;
  }
  return 0;
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

int coll_run(coll_comm_t *c, const coll_args_t *a) {
  if (c == NULL || a == NULL) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  int rc = coll__check_args(c, a);
  if (rc) return rc;
  if (c->error) return c->error;
  return coll__run_ordered(c, a);
}
