/*
 * algorithms.h - one function per collective kind (algo_*.c), called by the dispatcher
 * (collective.c) with checked, unaliased arguments. Each returns 0 or the communicator's
 * failure code, the same on every rank.
 */
#ifndef COLL_ALGORITHMS_H
#define COLL_ALGORITHMS_H

#include "coll.h"

int coll__barrier(coll_comm_t *c, const coll_args_t *a);
int coll__bcast(coll_comm_t *c, const coll_args_t *a);
int coll__gather(coll_comm_t *c, const coll_args_t *a);
int coll__scatter(coll_comm_t *c, const coll_args_t *a);
int coll__allgather(coll_comm_t *c, const coll_args_t *a);
int coll__allreduce(coll_comm_t *c, const coll_args_t *a); /* also reduce */
int coll__reduce_scatter(coll_comm_t *c, const coll_args_t *a);
int coll__alltoall(coll_comm_t *c, const coll_args_t *a);

/* algo_tree.c: small messages with many ranks. wanted: 1 when the tree is the choice for
 * kind (forced, or automatic with more than COLL_TREE_FANOUT ranks) and the message fits. */
int coll__tree_wanted(const coll_comm_t *c, coll_kind_t kind, int fits);
int coll__barrier_tree(coll_comm_t *c, const coll_args_t *a);
int coll__bcast_tree(coll_comm_t *c, const coll_args_t *a);
int coll__gather_tree(coll_comm_t *c, const coll_args_t *a);
int coll__reduce_tree(coll_comm_t *c, const coll_args_t *a); /* also allreduce */

#endif /* COLL_ALGORITHMS_H */
