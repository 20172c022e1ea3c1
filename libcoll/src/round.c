/*
 * round.c - the round layer (round.h): round numbers, slot parity and reuse, the
 * descriptor meet, and the staged exchange most algorithms are made of.
 *
 * Every collective starts at round t0 = (last round) + 1 with each rank's descriptor
 * (kind, dtype, count, op, root, algorithm) beside its flags. Each algorithm makes some
 * rank (the root, or everyone) compare all descriptors at t0 before it publishes data
 * others consume, and every rank waits on such a rank before it completes, except a rank
 * that only gives (a bcast's root, a small gather's sender), which stages and returns and
 * compares at its next call (coll__settle). So every rank gets its result or COLL_EMISMATCH
 * (such a giver at its next call), and arriving at collective s+1 anywhere implies that
 * rank finished s: what makes two descriptor copies and two slot parities enough.
 *
 * Slot reuse: my slot[t & 1] holds what I published at round t; before I write it again
 * (round t+2, or later) its readers must have said done for the round they last read it in.
 */
#include <stdio.h>
#include <string.h>

#include "round.h"

uint64_t coll__round_begin(coll_comm_t *c, const coll_args_t *a, int algo, uint64_t send_off,
                           uint64_t recv_off) {
  c->seq++;
  coll__desc_t *d = c->tp->desc(c, c->rank, c->seq);
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

void coll__round_single_copy(coll_comm_t *c) { c->tp->desc(c, c->rank, c->seq)->single_copy = 1; }

void coll__round_handover(coll_comm_t *c, uint64_t last) {
  c->round = last;
  c->extra_seq++; /* error messages count calls, not descriptors */
}

static int round_uses_op(coll_kind_t k) {
  return k == COLL_REDUCE || k == COLL_ALLREDUCE || k == COLL_REDUCE_SCATTER;
}
static int round_uses_root(coll_kind_t k) {
  return k == COLL_BCAST || k == COLL_GATHER || k == COLL_SCATTER || k == COLL_REDUCE;
}

static int round_describe(const coll__desc_t *d, char *buf, size_t len) {
  int n = snprintf(buf, len, "%s(count=%llu, dtype=%s", coll_kind_name((coll_kind_t)d->kind),
                   (unsigned long long)d->count, coll_dtype_name((coll_dtype_t)d->dtype));
  if (round_uses_op((coll_kind_t)d->kind))
    n += snprintf(buf + n, len - (size_t)n, ", op=%s", coll_op_name((coll_op_t)d->op));
  if (round_uses_root((coll_kind_t)d->kind))
    n += snprintf(buf + n, len - (size_t)n, ", root=%d", d->root);
  if (d->algo)
    n += snprintf(buf + n, len - (size_t)n, ", algorithm %d", d->algo);
  return n + snprintf(buf + n, len - (size_t)n, ")");
}

static int round_validate(coll_comm_t *c, int peer, uint64_t seq) {
  const coll__desc_t *mine = c->tp->desc(c, c->rank, seq);
  const coll__desc_t *theirs = c->tp->desc(c, peer, seq);
  coll_kind_t k = (coll_kind_t)mine->kind;
  int same = theirs->seq == mine->seq && theirs->kind == mine->kind &&
             theirs->dtype == mine->dtype && theirs->count == mine->count && theirs->algo == mine->algo &&
             (!round_uses_op(k) || theirs->op == mine->op) &&
             (!round_uses_root(k) || theirs->root == mine->root);
  if (same) return 0;
  char m[96], t[96];
  round_describe(mine, m, sizeof m);
  round_describe(theirs, t, sizeof t);
  return coll__fail(c, COLL_EMISMATCH, "ranks disagree in collective #%llu: rank %d called %s, rank %d called %s",
                    (unsigned long long)(mine->seq - c->extra_seq), c->rank, m, peer, t);
}

int coll__validate(coll_comm_t *c, int peer) { return round_validate(c, peer, c->seq); }

int coll__settle(coll_comm_t *c) {
  uint64_t seq = c->unchecked_seq, t0 = c->unchecked_round;
  c->unchecked_seq = 0;
  for (int k = 1; k < c->size && seq; k++) {
    int q = (c->rank + k) % c->size, rc = c->tp->wait_arrive(c, q, t0);
    if (rc == 0) rc = round_validate(c, q, seq);
    if (rc) return rc;
  }
  return 0;
}

int coll__meet(coll_comm_t *c, int peer, uint64_t t0) {
  int rc = c->tp->wait_arrive(c, peer, t0);
  return rc ? rc : coll__validate(c, peer);
}

int coll__meet_all(coll_comm_t *c, uint64_t t0) {
  for (int k = 1; k < c->size; k++) { /* start after myself: spreads the polling */
    int rc = coll__meet(c, (c->rank + k) % c->size, t0);
    if (rc) return rc;
  }
  return 0;
}

/* src's len bytes into my slot of round t, or (inl) into my descriptor's payload, then published */
static int post(coll_comm_t *c, uint64_t t, const void *src, size_t len, int reader, int inl) {
  uint8_t *slot;
  int rc = coll__stage(c, t, &slot);
  if (rc) return rc;
  if (inl) memcpy(c->tp->desc(c, c->rank, c->seq)->payload, src, len);
  else if (len) coll__stage_copy(c, slot, src, len);
  coll__publish_staged(c, t, reader, t);
  return 0;
}

int coll__post(coll_comm_t *c, uint64_t t, const void *src, size_t len, int reader) {
  return post(c, t, src, len, reader, 0);
}

int coll__post_inline(coll_comm_t *c, uint64_t t, const void *src, size_t len, int reader) {
  return post(c, t, src, len, reader, 1);
}

int coll__wait_all(coll_comm_t *c, uint64_t t) {
  for (int k = 1; k < c->size; k++) {
    int rc = c->tp->wait_arrive(c, (c->rank + k) % c->size, t);
    if (rc) return rc;
  }
  return 0;
}

int coll__wait_all_finished(coll_comm_t *c, uint64_t t) {
  for (int k = 1; k < c->size; k++) {
    int rc = c->tp->wait_done(c, (c->rank + k) % c->size, t);
    if (rc) return rc;
  }
  return 0;
}

int coll__wait_children_finished(coll_comm_t *c, int root, uint64_t t) {
  coll__tree_view_t v;
  coll__tree_view(c, root, &v);
  for (int i = 0; i < v.n; i++) {
    int rc = c->tp->wait_done(c, v.child[i], t);
    if (rc) return rc;
  }
  return 0;
}

int coll__tree_meet(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t0) {
  int rc = v->parent >= 0 ? coll__meet(c, v->parent, t0) : 0;
  for (int i = 0; i < v->n && rc == 0; i++) rc = coll__meet(c, v->child[i], t0);
  return rc;
}

int coll__wait_children(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t) {
  for (int i = 0; i < v->n; i++) {
    int rc = c->tp->wait_arrive(c, v->child[i], t);
    if (rc) return rc;
  }
  return 0;
}

static int round_exchange(coll_comm_t *c, uint64_t t0, uint64_t k, coll__fill_fn fill,
                          coll__take_fn take, int take_each, void *ctx) {
  uint64_t t = t0 + k;
  uint8_t *slot;
  int rc = coll__stage(c, t, &slot);
  if (rc) return rc;
  fill(ctx, k, slot);
  coll__publish_staged(c, t, -1, t);
  if (!take_each) {
    if ((rc = k == 0 ? coll__meet_all(c, t0) : coll__wait_all(c, t)) != 0) return rc;
    take(ctx, k, -1, NULL);
  }
  for (int i = 1; take_each && i < c->size; i++) {
    int q = (c->rank + i) % c->size;
    if ((rc = k == 0 ? coll__meet(c, q, t0) : coll__wait(c, q, t)) != 0) return rc;
    take(ctx, k, q, coll__peer_slot(c, q, t));
  }
  coll__finish(c, t);
  return 0;
}

int coll__exchange(coll_comm_t *c, const coll_args_t *a, uint64_t K, coll__fill_fn fill,
                   coll__take_fn take, int take_each, void *ctx) {
  uint64_t t0 = coll__round_begin(c, a, 0, 0, 0);
  coll__round_end(c, t0 + K - 1);
  for (uint64_t k = 0; k < K; k++) {
    int rc = round_exchange(c, t0, k, fill, take, take_each, ctx);
    if (rc) return rc;
  }
  return 0;
}

void coll__stage_pieces(uint8_t *slot, const uint8_t *src, size_t nbytes, size_t piece,
                        size_t off, size_t len, int P, int skip) {
  for (int q = 0; q < P && len; q++)
    if (q != skip) memcpy(slot + (size_t)q * piece, src + (size_t)q * nbytes + off, len);
}
