/*
 * algo_allgather.c - every rank gets every rank's block ("flat").
 *
 * Each round every rank stages the next slot-sized chunk of its block,
 * publishes, waits for all, and copies chunk k of every other block into
 * place; descriptors are compared by everyone at the first round. The own
 * block is a local copy (skipped in place), made first and then staged from,
 * so `send` may lie anywhere in `recv` (send == recv + rank*count in place,
 * or send == recv): other blocks are written only after it was read.
 */
#include <string.h>

#include "coll_internal.h"

int coll__allgather(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  size_t chunk = c->hdr->slot_bytes;
  uint64_t K = nbytes ? coll__div_up(nbytes, chunk) : 1;
  int me = c->rank, rc;
  const uint8_t *send = a->send;
  uint8_t *recv = a->recv;
  if (nbytes && recv + (size_t)me * nbytes != send) memmove(recv + (size_t)me * nbytes, send, nbytes);
  if (nbytes) send = recv + (size_t)me * nbytes; /* nobody writes my own block from here on */
  uint64_t t0 = coll__begin(c, a, 0, 0);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    int p;
    if ((rc = coll__slot_acquire(c, t, &p)) != 0) return rc;
    size_t off = k * chunk, len = coll__min(chunk, nbytes - off);
    if (len) memcpy(coll__slot(c, me, p), send + off, len);
    coll__publish_arrive(c, t);
    coll__slot_release(c, p, t, -1);
    for (int i = 1; i < c->size; i++) {
      int q = (me + i) % c->size;
      rc = k == 0 ? coll__meet(c, q, t0) : coll__wait_arrive(c, q, t);
      if (rc) return rc;
      if (len) memcpy(recv + (size_t)q * nbytes + off, coll__slot(c, q, p), len);
    }
    coll__publish_done(c, t);
  }
  c->round = t0 + K - 1;
  return 0;
}
