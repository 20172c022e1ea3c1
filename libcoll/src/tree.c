/*
 * tree.c - the tree that small collectives run on when there are many ranks.
 *
 * With P ranks all polling all P flags, a line is read by P-1 ranks at once; on a 64-core
 * KNL that is the mesh traffic DESIGN.md warns against. On the tree a rank waits on its
 * parent and at most COLL_TREE_FANOUT children, so no flag has more than a handful of
 * readers. The shape follows the hardware: ranks are ordered by the first CPU they may run
 * on; ranks that share an L2 (the two cores of a KNL tile) hang off the first of them,
 * which forwards for the tile; the tile leaders of each cluster (a NUMA node's CPUs: an
 * SNC domain) form a tree in CPU order, each subtree a run of neighbouring CPUs; the
 * clusters' first leaders are joined by a tree of their own. No rank has more than
 * COLL_TREE_FANOUT children, and only (clusters - 1) edges cross between clusters.
 *
 * Every rank builds the same tree from the same facts (each rank's first CPU, L2 and NUMA
 * node, in the control lines) once, when the communicator is made. A rooted collective (bcast, gather,
 * reduce from root R) uses the same shape with R and the tree's root swapping places.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "tree.h"

enum { TREE_TILE_MAX = COLL_TREE_FANOUT / 2 }; /* ranks under a tile leader: keeps k >= 4 */

typedef struct {
  int rank, pu;
} tree_pos_t;

static int tree_pos_cmp(const void *x, const void *y) {
  const tree_pos_t *a = x, *b = y;
  if (a->pu != b->pu) return a->pu < b->pu ? -1 : 1;
  return (a->rank > b->rank) - (a->rank < b->rank);
}

/* leaders[lo] heads leaders[lo, hi): the rest in k_head runs as even as can be, each run's
 * first a child of it and the head of its run with k children. Every subtree is a run. */
static void tree_split(const int *leaders, int lo, int hi, int k_head, int k, int *parent) {
  int rest = hi - lo - 1;
  for (int i = 0, from = lo + 1; i < k_head && from < hi; i++) {
    int to = lo + 1 + (int)((long)rest * (i + 1) / k_head);
    if (to <= from) continue;
    parent[leaders[from]] = leaders[lo];
    tree_split(leaders, from, to, k, k, parent);
    from = to;
  }
}

/* The tile leaders, cluster by cluster (in order of their first CPU): each cluster's first
 * leader heads its cluster's tree; those heads form a tree of their own with k/2 children,
 * so only (clusters - 1) edges leave a cluster and a head keeps k children in all. */
static int tree_link_leaders(const int *leaders, int nleaders, const int *cluster, int k, int *parent) {
  int *grouped = malloc((size_t)nleaders * sizeof *grouped), *start = malloc((size_t)(nleaders + 1) * sizeof *start);
  int *head = malloc((size_t)nleaders * sizeof *head), *ntop = calloc((size_t)nleaders, sizeof *ntop);
  if (!grouped || !start || !head || !ntop) {
    free(grouped), free(start), free(head), free(ntop);
    return -ENOMEM;
  }
  int ngroups = 0, used = 0;
  for (int i = 0; i < nleaders; i++) { /* a cluster's leaders, once, from its first one */
    int seen = 0;
    for (int g = 0; g < ngroups && !seen; g++) seen = cluster[head[g]] == cluster[leaders[i]];
    if (seen) continue;
    head[ngroups] = leaders[i];
    start[ngroups++] = used;
    for (int j = i; j < nleaders; j++)
      if (cluster[leaders[j]] == cluster[leaders[i]]) grouped[used++] = leaders[j];
  }
  start[ngroups] = used;
  int k_top = k / 2 > 1 ? k / 2 : 1;
  tree_split(head, 0, ngroups, k_top, k_top, parent);
  for (int g = 0; g < ngroups; g++)
    for (int h = 1; h < ngroups; h++) ntop[g] += parent[head[h]] == head[g];
  for (int g = 0; g < ngroups; g++)
    tree_split(grouped, start[g], start[g + 1], k - ntop[g], k, parent);
  free(grouped), free(start), free(head), free(ntop);
  return 0;
}

int coll_tree_build(int n, const int *pu, const int *tile, const int *cluster, int *parent) {
  if (n < 1 || pu == NULL || tile == NULL || cluster == NULL || parent == NULL) return COLL_EBADARG;
  tree_pos_t *order = malloc((size_t)n * sizeof *order);
  int *leader = malloc((size_t)n * sizeof *leader); /* by rank: its tile leader, or itself */
  int *members = calloc((size_t)n, sizeof *members); /* by rank: ranks under it */
  int *leaders = malloc((size_t)n * sizeof *leaders);
  int *mine = malloc((size_t)n * sizeof *mine); /* parent[] is written only on success */
  int rc = -ENOMEM;
  if (order && leader && members && leaders && mine) {
    for (int r = 0; r < n; r++) order[r] = (tree_pos_t){r, pu[r] < 0 ? 1 << 30 : pu[r]};
    qsort(order, (size_t)n, sizeof *order, tree_pos_cmp);
    int nleaders = 0, most = 0;
    for (int i = 0; i < n; i++) {
      int r = order[i].rank, lead = -1;
      for (int j = nleaders - 1; tile[r] >= 0 && j >= 0 && lead < 0; j--) /* its tile's leader */
        if (tile[leaders[j]] == tile[r] && members[leaders[j]] < TREE_TILE_MAX) lead = leaders[j];
      leader[r] = lead < 0 ? r : lead;
      if (lead < 0) leaders[nleaders++] = r;
      else if (++members[lead] > most) most = members[lead];
    }
    for (int r = 0; r < n; r++) mine[r] = leader[r] != r ? leader[r] : -1;
    /* leader children beside the tile's ranks */
    rc = tree_link_leaders(leaders, nleaders, cluster, COLL_TREE_FANOUT - most, mine);
    if (rc == 0) memcpy(parent, mine, (size_t)n * sizeof *parent);
  }
  free(order), free(leader), free(members), free(leaders), free(mine);
  return rc;
}

/* Children in CSR form (in order of the CPUs they run on), subtree sizes and a preorder
 * walk, in which every subtree is one contiguous run (gather packs in that order). */
static int tree_walk(coll__tree_t *t, const int *pu) {
  int n = t->n, top = 0, used = 0;
  int *fill = malloc((size_t)n * sizeof *fill), *stack = malloc((size_t)n * sizeof *stack);
  tree_pos_t *order = malloc((size_t)n * sizeof *order);
  if (!fill || !stack || !order) {
    free(fill), free(stack), free(order);
    return -ENOMEM;
  }
  for (int r = 0; r <= n; r++) t->first[r] = 0;
  for (int r = 0; r < n; r++)
    if (t->parent[r] >= 0) t->first[t->parent[r] + 1]++;
  for (int r = 0; r < n; r++) t->first[r + 1] += t->first[r];
  memcpy(fill, t->first, (size_t)n * sizeof *fill);
  for (int r = 0; r < n; r++) order[r] = (tree_pos_t){r, pu[r] < 0 ? 1 << 30 : pu[r]};
  qsort(order, (size_t)n, sizeof *order, tree_pos_cmp);
  for (int i = 0; i < n; i++) {
    int r = order[i].rank;
    if (t->parent[r] >= 0) t->child[fill[t->parent[r]]++] = r;
  }
  stack[top++] = t->root;
  while (top) {
    int r = stack[--top];
    t->pre[used++] = r;
    for (int i = t->first[r + 1] - 1; i >= t->first[r]; i--) stack[top++] = t->child[i];
  }
  for (int i = 0; i < n; i++) t->pre_at[t->pre[i]] = i;
  for (int i = n - 1; i >= 0; i--) { /* children come after their parent in preorder */
    int r = t->pre[i];
    t->size[r] = 1;
    for (int j = t->first[r]; j < t->first[r + 1]; j++) t->size[r] += t->size[t->child[j]];
  }
  free(fill), free(stack), free(order);
  return 0;
}

/* The first CPU of my affinity and the first CPU of the L2 that holds it, when all of my
 * CPUs are in that L2 (else -1: I am not confined to one tile). From sysfs, which is where
 * hwloc reads it too. */
static int tree_read_list(const char *path, cpu_set_t *set) {
  char text[1024];
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  int ok = fgets(text, sizeof text, f) != NULL;
  fclose(f);
  CPU_ZERO(set);
  for (char *s = text; ok && *s && *s != '\n';) {
    char *end;
    long lo = strtol(s, &end, 10), hi = lo;
    if (end == s) return -1;
    if (*end == '-') hi = strtol(end + 1, &end, 10);
    for (long cpu = lo; cpu <= hi && cpu < CPU_SETSIZE; cpu++) CPU_SET((int)cpu, set);
    s = *end == ',' ? end + 1 : end;
  }
  return ok ? 0 : -1;
}

/* The NUMA node of every CPU of mine, if they share one; else -1. */
static int32_t tree_node_of(const cpu_set_t *mine, int first) {
  char path[96];
  cpu_set_t node, both;
  for (int n = 0; n < 1024; n++) {
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", n);
    if (tree_read_list(path, &node) != 0) {
      if (n > 64) return -1; /* node numbers may have holes; none past a long run of them */
      continue;
    }
    if (!CPU_ISSET(first, &node)) continue;
    CPU_AND(&both, mine, &node);
    return CPU_EQUAL(&both, mine) ? n : -1;
  }
  return -1;
}

void coll__tree_locate(const cpu_set_t *mine, int32_t *pu_p, int32_t *tile_p, int32_t *cluster_p) {
  int first = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && first < 0; cpu++)
    if (CPU_ISSET(cpu, mine)) first = cpu;
  *pu_p = first;
  *tile_p = -1;
  *cluster_p = first >= 0 ? tree_node_of(mine, first) : -1;
  for (int idx = 0; first >= 0 && idx < 8; idx++) {
    char path[96];
    cpu_set_t l2, both;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", first, idx);
    FILE *f = fopen(path, "r");
    int level = 0;
    if (!f) return;
    int got = fscanf(f, "%d", &level);
    fclose(f);
    if (got != 1 || level != 2) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", first, idx);
    if (tree_read_list(path, &l2) != 0) return;
    CPU_AND(&both, mine, &l2);
    if (!CPU_EQUAL(&both, mine)) return;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &l2)) {
        *tile_p = cpu;
        return;
      }
  }
}

int coll__tree_init(coll_comm_t *c) {
  int n = c->size;
  coll__tree_t *t = calloc(1, sizeof *t);
  int *mem = malloc((size_t)5 * (size_t)n * sizeof *mem);
  int *pu = calloc((size_t)n, sizeof *pu), *tile = calloc((size_t)n, sizeof *tile);
  int *cluster = calloc((size_t)n, sizeof *cluster);
  int rc = -ENOMEM;
  if (t && mem && pu && tile && cluster) {
    t->n = n;
    t->parent = mem, t->child = mem + n, t->size = mem + 2 * n, t->pre = mem + 3 * n;
    t->pre_at = mem + 4 * n;
    t->first = malloc((size_t)(n + 1) * sizeof *t->first);
    for (int r = 0; r < n; r++) pu[r] = c->ctl[r].pu, tile[r] = c->ctl[r].tile, cluster[r] = c->ctl[r].cluster;
    rc = t->first ? coll_tree_build(n, pu, tile, cluster, t->parent) : -ENOMEM;
    for (int r = 0; rc == 0 && r < n; r++)
      if (t->parent[r] < 0) t->root = r;
    if (rc == 0) rc = tree_walk(t, pu);
  }
  free(pu), free(tile), free(cluster);
  if (rc == 0) {
    c->tree = t;
    return 0;
  }
  if (t) free(t->first);
  free(t), free(mem);
  return rc;
}

void coll__tree_free(coll_comm_t *c) {
  if (c->tree) free(c->tree->parent), free(c->tree->first);
  free(c->tree);
  c->tree = NULL;
}

void coll__tree_view(const coll_comm_t *c, int root, coll__tree_view_t *v) {
  const coll__tree_t *t = c->tree;
  int at = coll__tree_swap(t, root, c->rank), p = t->parent[at];
  v->root = root;
  v->parent = p < 0 ? -1 : coll__tree_swap(t, root, p);
  v->n = t->first[at + 1] - t->first[at];
  for (int i = 0; i < v->n; i++) v->child[i] = coll__tree_swap(t, root, t->child[t->first[at] + i]);
}
