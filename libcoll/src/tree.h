/*
 * tree.h - the tree small collectives run on with many ranks (tree.c builds it once per
 * communicator; algo_tree.c runs on it through the round layer).
 */
#ifndef COLL_TREE_H
#define COLL_TREE_H

#include <sched.h>

#include "coll_internal.h"

/* The shape rooted at `root` (the rank on the lowest CPU). */
struct coll__tree {
  int n, root;
  int *parent;  /* by rank, -1 for the root */
  int *first;   /* children of r: child[first[r] .. first[r+1]) */
  int *child;
  int *size;    /* ranks in r's subtree, r included */
  int *pre;     /* preorder: each subtree is pre[pre_at[r] .. pre_at[r] + size[r]) */
  int *pre_at;
};

/* One rank's neighbours in the tree rooted at `root`. */
typedef struct {
  int root, parent, n; /* parent -1: I am the root */
  int child[COLL_TREE_FANOUT];
} coll__tree_view_t;

/* The same shape rooted at R: R and the tree's root trade places. The rank at place x. */
static inline int coll__tree_swap(const coll__tree_t *t, int R, int x) {
  return x == R ? t->root : x == t->root ? R : x;
}

/* My first CPU, my L2's first CPU and my NUMA node (-1: my CPUs span more than one, or
 * unknown). */
void coll__tree_locate(const cpu_set_t *mine, int32_t *pu_p, int32_t *tile_p, int32_t *cluster_p);
/* Build c->tree from every rank's pu/tile in the control lines: 0 or -ENOMEM. */
int coll__tree_init(coll_comm_t *c);
void coll__tree_free(coll_comm_t *c);
void coll__tree_view(const coll_comm_t *c, int root, coll__tree_view_t *v);

#endif /* COLL_TREE_H */
