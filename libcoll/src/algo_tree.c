/*
 * algo_tree.c - small collectives on the tree (tree.c): barrier, and bcast, gather, reduce
 * and allreduce of messages that fit in one staging slot. The default with more than
 * COLL_TREE_FANOUT ranks when every rank has a CPU of its own; HBMCOLL_ALGO=<kind>=tree
 * forces it at any size (larger messages then take the automatic choice).
 *
 * Three rounds, the same for every kind:
 *   t0    every rank arrives with its descriptor and compares it with its parent's and its
 *         children's (coll__tree_meet);
 *   t0+1  up: once all its children arrived, a rank arrives itself; reduce and gather carry
 *         data (a child's partial result, or its subtree's blocks in preorder, in its slot);
 *   t0+2  down: the root arrives, then each rank once its parent did; bcast and allreduce
 *         carry the result (a rank copies its parent's slot, its children copy its slot).
 * No rank completes before the root's t0+2, which comes only after every rank compared its
 * neighbours: a disagreement anywhere fails every rank. A flag is read by its rank's parent
 * and children only: at most COLL_TREE_FANOUT + 1 readers, against P - 1 in the flat
 * algorithms.
 *
 * A reduction runs up the tree: each rank reduces its input with its children's partial
 * results (its own first, then its children in CPU order). The association differs from
 * flat's rank order, but every rank gets the root's result, bitwise the same. AVG sums on
 * the way up and divides once, at the root.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

enum { TREE_ALGO = 9 }; /* in descriptors: differs from every flat algorithm's id */

int coll__tree_wanted(const coll_comm_t *c, coll_kind_t kind, int fits) {
  if (!fits || coll__tree(c) == NULL) return 0;
  int forced = coll__forced_algo(c, kind);
  /* oversubscribed, a wait sleeps instead of polling, and each level of the tree costs a
   * wake-up in turn: flat is faster there (bench/README.md) */
  return forced ? forced == coll__algo_id(kind, "tree") : c->size > COLL_TREE_FANOUT && coll__roomy(c);
}

static int tree_enter(coll_comm_t *c, const coll_args_t *a, int root, coll__tree_view_t *v,
                      uint64_t *t0) {
  coll__tree_view(c, root, v);
  *t0 = coll__round_begin(c, a, TREE_ALGO, 0, 0);
  coll__round_end(c, *t0 + 2);
  coll__publish(c, *t0);
  return coll__tree_meet(c, v, *t0);
}

/* Down: after my parent's t0+2; with data, len bytes of its slot into buf. */
static int tree_wait_parent(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t0, void *buf,
                            size_t len) {
  int rc = coll__wait(c, v->parent, t0 + 2);
  if (rc == 0 && len) memcpy(buf, coll__peer_slot(c, v->parent, t0 + 2), len);
  return rc;
}

/* Down to my children: my arrival at t0+2, with len bytes of buf staged for them. */
static int tree_release(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t0, const void *buf,
                        size_t len) {
  if (v->n == 0) return 0;
  if (len == 0) {
    coll__publish(c, t0 + 2);
    return 0;
  }
  uint8_t *slot;
  int rc = coll__stage(c, t0 + 2, &slot);
  if (rc) return rc;
  memcpy(slot, buf, len);
  coll__publish_staged(c, t0 + 2, coll__tree_readers(v->root), t0 + 2);
  return 0;
}

int coll__barrier_tree(coll_comm_t *c, const coll_args_t *a) {
  coll__tree_view_t v;
  uint64_t t0;
  int rc = tree_enter(c, a, coll__tree(c)->root, &v, &t0);
  if (rc || (rc = coll__wait_children(c, &v, t0 + 1)) != 0) return rc;
  if (v.parent >= 0) {
    coll__publish(c, t0 + 1);
    if ((rc = tree_wait_parent(c, &v, t0, NULL, 0)) != 0) return rc;
  }
  return tree_release(c, &v, t0, NULL, 0);
}

int coll__bcast_tree(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  coll__tree_view_t v;
  uint64_t t0;
  int rc = tree_enter(c, a, a->root, &v, &t0);
  if (rc || (rc = coll__wait_children(c, &v, t0 + 1)) != 0) return rc;
  if (v.parent >= 0) {
    coll__publish(c, t0 + 1);
    if ((rc = tree_wait_parent(c, &v, t0, a->recv, nbytes)) != 0) return rc;
  }
  return tree_release(c, &v, t0, a->recv, nbytes);
}

/* The root: the blocks of each child's subtree, in preorder, from its slot into place. */
static void gather_unpack(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t, uint8_t *recv,
                          size_t nbytes) {
  const coll__tree_t *t_ = coll__tree(c);
  for (int i = 0; i < v->n; i++) {
    int at = coll__tree_swap(t_, v->root, v->child[i]), first = t_->pre_at[at];
    const uint8_t *from = coll__peer_slot(c, v->child[i], t);
    for (int j = 0; j < t_->size[at]; j++) {
      int q = coll__tree_swap(t_, v->root, t_->pre[first + j]);
      memcpy(recv + (size_t)q * nbytes, from + (size_t)j * nbytes, nbytes);
    }
  }
}

int coll__gather_tree(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  coll__tree_view_t v;
  uint64_t t0;
  int rc = tree_enter(c, a, a->root, &v, &t0);
  if (rc || (rc = coll__wait_children(c, &v, t0 + 1)) != 0) return rc;
  if (v.parent < 0) {
    uint8_t *mine = (uint8_t *)a->recv + (size_t)c->rank * nbytes;
    if (nbytes && mine != (const uint8_t *)a->send) memmove(mine, a->send, nbytes);
    if (nbytes) gather_unpack(c, &v, t0 + 1, a->recv, nbytes);
    return tree_release(c, &v, t0, NULL, 0);
  }
  uint8_t *slot; /* mine, then each child's subtree as it packed it */
  if ((rc = coll__stage(c, t0 + 1, &slot)) != 0) return rc;
  const coll__tree_t *tree = coll__tree(c);
  size_t off = nbytes;
  if (nbytes) memcpy(slot, a->send, nbytes);
  for (int i = 0; i < v.n && nbytes; i++) {
    size_t len = (size_t)tree->size[coll__tree_swap(tree, v.root, v.child[i])] * nbytes;
    memcpy(slot + off, coll__peer_slot(c, v.child[i], t0 + 1), len);
    off += len;
  }
  coll__publish_staged(c, t0 + 1, v.parent, t0 + 1);
  if ((rc = tree_wait_parent(c, &v, t0, NULL, 0)) != 0) return rc;
  return tree_release(c, &v, t0, NULL, 0);
}

/* reduce to a->root, or allreduce (the tree's own root reduces, then the result goes down). */
int coll__reduce_tree(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  int all = a->kind == COLL_ALLREDUCE;
  coll__tree_view_t v;
  uint64_t t0;
  int rc = tree_enter(c, a, all ? coll__tree(c)->root : a->root, &v, &t0);
  if (rc || (rc = coll__wait_children(c, &v, t0 + 1)) != 0) return rc;
  const void *in[1 + COLL_TREE_FANOUT] = {a->send};
  for (int i = 0; i < v.n; i++) in[1 + i] = coll__peer_slot(c, v.child[i], t0 + 1);
  if (v.parent < 0) {
    coll_reduce_local(a->dtype, a->op, a->recv, in, 1 + (size_t)v.n, a->count, (size_t)c->size);
    return tree_release(c, &v, t0, a->recv, all ? nbytes : 0);
  }
  uint8_t *slot;
  if ((rc = coll__stage(c, t0 + 1, &slot)) != 0) return rc;
  if (v.n == 0 && nbytes) memcpy(slot, a->send, nbytes);
  else /* partial sums of an average: divided once, at the root */
    coll_reduce_local(a->dtype, a->op == COLL_AVG ? COLL_SUM : a->op, slot, in, 1 + (size_t)v.n,
                      a->count, 1);
  coll__publish_staged(c, t0 + 1, v.parent, t0 + 1);
  if ((rc = tree_wait_parent(c, &v, t0, a->recv, all ? nbytes : 0)) != 0) return rc;
  return tree_release(c, &v, t0, a->recv, all ? nbytes : 0);
}
