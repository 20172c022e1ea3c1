/*
 * algo_reduce_scatter.c - rank r gets op over all ranks of block r ("flat").
 *
 * Each round is an exchange (round.c): every rank stages the next piece (slot/P bytes,
 * whole elements) of every block side by side, and once all arrived reduces its own
 * piece from all P slots in one P-way pass (ranks in order 0..P-1, so the result does
 * not depend on timing) straight into its receive buffer.
 */
#include "algorithms.h"
#include "round.h"

typedef struct {
  coll_comm_t *c;
  const coll_args_t *a;
  size_t nbytes, piece;
  uint64_t t0;
} reduce_scatter_t;

static size_t reduce_scatter_len(const reduce_scatter_t *x, uint64_t k) {
  return x->nbytes ? coll__min(x->piece, x->nbytes - k * x->piece) : 0;
}

static void reduce_scatter_fill(void *ctx, uint64_t k, uint8_t *slot) {
  reduce_scatter_t *x = ctx;
  coll__stage_pieces(slot, x->a->send, x->nbytes, x->piece, k * x->piece, reduce_scatter_len(x, k),
                     x->c->size, -1);
}

static void reduce_scatter_take(void *ctx, uint64_t k, int peer, const uint8_t *slot) {
  (void)peer, (void)slot; /* all at once */
  reduce_scatter_t *x = ctx;
  int P = x->c->size;
  const void *in[P];
  for (int q = 0; q < P; q++)
    in[q] = coll__peer_slot(x->c, q, x->t0 + k) + (size_t)x->c->rank * x->piece;
  size_t len = reduce_scatter_len(x, k), es = coll_dtype_size(x->a->dtype);
  if (len)
    coll_reduce_local(x->a->dtype, x->a->op, (uint8_t *)x->a->recv + k * x->piece, in, (size_t)P,
                      len / es, (size_t)P);
}

int coll__reduce_scatter(coll_comm_t *c, const coll_args_t *a) {
  size_t es = coll_dtype_size(a->dtype);
  reduce_scatter_t x = {c, a, a->count * es, ((coll__slot_bytes(c) / (size_t)c->size) & ~(size_t)63) / es * es,
                        coll__round_next(c)};
  uint64_t K = x.nbytes ? coll__div_up(x.nbytes, x.piece) : 1;
  return coll__exchange(c, a, K, reduce_scatter_fill, reduce_scatter_take, 0, &x);
}
