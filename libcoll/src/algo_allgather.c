/*
 * algo_allgather.c - every rank gets every rank's block ("flat").
 *
 * Each round is an exchange (round.c): every rank stages the next slot-sized chunk of
 * its block, and copies chunk k of every other block into place; descriptors are
 * compared by everyone at the first round. The own block is a local copy (skipped in
 * place), made first and then staged from, so `send` may lie anywhere in `recv`
 * (send == recv + rank*count in place, or send == recv): other blocks are written only
 * after it was read.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

typedef struct {
  const uint8_t *send;
  uint8_t *recv;
  size_t nbytes, chunk;
  const coll_comm_t *c;
} allgather_t;

static size_t allgather_len(const allgather_t *g, uint64_t k) {
  return coll__min(g->chunk, g->nbytes - k * g->chunk);
}

static void allgather_fill(void *ctx, uint64_t k, uint8_t *slot) {
  allgather_t *g = ctx;
  if (g->nbytes) coll__stage_copy(g->c, slot, g->send + k * g->chunk, allgather_len(g, k)); /* every peer reads it */
}

static void allgather_take(void *ctx, uint64_t k, int peer, const uint8_t *slot) {
  allgather_t *g = ctx;
  if (g->nbytes) memcpy(g->recv + (size_t)peer * g->nbytes + k * g->chunk, slot, allgather_len(g, k));
}

int coll__allgather(coll_comm_t *c, const coll_args_t *a) {
  allgather_t g = {a->send, a->recv, a->count * coll_dtype_size(a->dtype), coll__slot_bytes(c), c};
  uint8_t *mine = g.recv + (size_t)c->rank * g.nbytes;
  if (g.nbytes && mine != g.send) memmove(mine, g.send, g.nbytes);
  if (g.nbytes) g.send = mine; /* nobody writes my own block from here on */
  uint64_t K = g.nbytes ? coll__div_up(g.nbytes, g.chunk) : 1;
  return coll__exchange(c, a, K, allgather_fill, allgather_take, 1, &g);
}
