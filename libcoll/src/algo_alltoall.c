/*
 * algo_alltoall.c - block q of rank r's send goes to block r of rank q's recv.
 *
 * Each round is an exchange (round.c): every rank stages the next piece (slot/P bytes)
 * of each of its outgoing blocks side by side in its slot, and copies its piece out of
 * every peer's slot. In place works: chunk k of every block is staged before chunk k of
 * the receive side is written.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

typedef struct {
  const uint8_t *send;
  uint8_t *recv;
  size_t nbytes, piece;
  int me, P;
} alltoall_t;

static size_t alltoall_len(const alltoall_t *x, uint64_t k) {
  return x->nbytes ? coll__min(x->piece, x->nbytes - k * x->piece) : 0;
}

static void alltoall_fill(void *ctx, uint64_t k, uint8_t *slot) {
  alltoall_t *x = ctx;
  size_t off = k * x->piece, len = alltoall_len(x, k);
  coll__stage_pieces(slot, x->send, x->nbytes, x->piece, off, len, x->P, x->me);
  size_t mine = (size_t)x->me * x->nbytes + off; /* my own block: a local copy */
  if (len && x->recv != x->send) memmove(x->recv + mine, x->send + mine, len);
}

static void alltoall_take(void *ctx, uint64_t k, int peer, const uint8_t *slot) {
  alltoall_t *x = ctx;
  size_t len = alltoall_len(x, k);
  if (len) memcpy(x->recv + (size_t)peer * x->nbytes + k * x->piece, slot + (size_t)x->me * x->piece, len);
}

int coll__alltoall(coll_comm_t *c, const coll_args_t *a) {
  alltoall_t x = {a->send, a->recv, a->count * coll_dtype_size(a->dtype),
                  (coll__slot_bytes(c) / (size_t)c->size) & ~(size_t)63, c->rank, c->size};
  uint64_t K = x.nbytes ? coll__div_up(x.nbytes, x.piece) : 1;
  return coll__exchange(c, a, K, alltoall_fill, alltoall_take, 1, &x);
}
