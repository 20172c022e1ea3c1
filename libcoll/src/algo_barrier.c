/*
 * algo_barrier.c - every rank publishes its arrival at one round and waits
 * for all the others ("flat"): one round, P-1 flag reads per rank. With more ranks, the
 * tree (algo_tree.c).
 */
#include "algorithms.h"
#include "round.h"

int coll__barrier(coll_comm_t *c, const coll_args_t *a) {
  c->algorithm = coll__tree_wanted(c, COLL_BARRIER, 1) ? "tree" : "flat";
  if (c->algorithm[0] == 't') return coll__barrier_tree(c, a);
  uint64_t t0 = coll__round_begin(c, a, 0, 0, 0);
  coll__publish(c, t0);
  coll__round_end(c, t0);
  return coll__meet_all(c, t0);
}
