/*
 * algo_barrier.c - every rank publishes its arrival at one round and waits
 * for all the others ("flat"): one round, P-1 flag reads per rank.
 * Fine up to a few dozen ranks; a tree would cut the P^2 line transfers on a
 * 64-core KNL (not built yet).
 */
#include "coll_internal.h"

int coll__barrier(coll_comm_t *c, const coll_args_t *a) {
  uint64_t t0 = coll__begin(c, a, 0, 0);
  coll__publish_arrive(c, t0);
  int rc = coll__meet_all(c, t0);
  c->round = t0;
  return rc;
}
