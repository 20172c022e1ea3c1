/*
 * tree_report.c - the tree small collectives would run on for a plan (`coll-topo --tree`):
 * for every rank, the PU it runs on, its L2 tile, and the PUs of the parent and children
 * it waits on. The tree is libcoll's own (coll_tree_build), fed what a rank sees at run
 * time: the first CPU of its set, its L2's first CPU when the whole set is in one L2, and
 * its cluster (at run time the NUMA node of its CPUs).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* open_memstream */
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "coll.h"
#include "numa_internal.h"

/* The tile of a planned rank: its CPUs' common L2 (first PU), or -1. */
static int tree_rank_tile(const coll_numa_topo_t *topo, const coll_numa_rank_t *rk) {
  int tile = -2;
  for (int i = 0; i < rk->ncpus; i++) {
    int found = -1;
    for (int c = 0; c < topo->nclusters && found < 0; c++)
      for (int k = 0; k < topo->clusters[c].ncores && found < 0; k++) {
        const coll_numa_core_t *co = &topo->clusters[c].cores[k];
        for (int p = 0; p < co->npus; p++)
          if (co->pus[p] == rk->cpus[i]) found = co->tile >= 0 ? co->tile : -1;
      }
    if (found < 0 || (tile != -2 && tile != found)) return -1;
    tile = found;
  }
  return tile < 0 ? -1 : tile;
}

static int tree_level(const int *parent, int r) {
  int d = 0;
  while (parent[r] >= 0) r = parent[r], d++;
  return d;
}

static void tree_render(FILE *f, int n, const int *pu, const int *tile, const int *parent, int json) {
  int depth = 0;
  for (int r = 0; r < n; r++)
    if (tree_level(parent, r) > depth) depth = tree_level(parent, r);
  if (json) fprintf(f, "{\n \"fanout\": %d,\n \"depth\": %d,\n \"ranks\": [", COLL_TREE_FANOUT, depth);
  else fprintf(f, "tree of %d ranks (at most %d children each): depth %d\n", n, COLL_TREE_FANOUT, depth);
  for (int r = 0; r < n; r++) {
    int p = parent[r];
    if (json) {
      fprintf(f, "%s\n  {\"rank\": %d, \"pu\": %d, \"tile\": %d, \"level\": %d, \"parent\": %d, "
                 "\"parent_pu\": %d, \"children_pus\": [", r ? "," : "", r, pu[r], tile[r],
              tree_level(parent, r), p, p >= 0 ? pu[p] : -1);
    } else {
      fprintf(f, "level %d: rank %d (PU %d, tile %d) waits on ", tree_level(parent, r), r, pu[r], tile[r]);
      if (p >= 0) fprintf(f, "its parent on PU %d", pu[p]);
      else fprintf(f, "no parent (root)");
      fprintf(f, "; children on PUs");
    }
    int nchild = 0;
    for (int q = 0; q < n; q++)
      if (parent[q] == r) fprintf(f, json ? "%s%d" : "%s %d", json && nchild++ ? ", " : "", pu[q]);
    fprintf(f, json ? "]}" : "\n");
  }
  if (json) fprintf(f, "\n ]\n}\n");
}

int coll_numa_tree_report(const char *topology_path, int nranks, const char *memory_policy,
                          const char *bind_policy, int json, char **text_p) {
  coll_numa_topo_t *topo = NULL;
  coll_numa_plan_t *plan = NULL;
  if (text_p == NULL) return -EINVAL;
  int rc = coll__numa_plan_for(topology_path, nranks, memory_policy, bind_policy, &topo, &plan);
  if (rc) return rc;
  nranks = plan->nranks;
  int *pu = malloc((size_t)nranks * sizeof *pu), *tile = malloc((size_t)nranks * sizeof *tile);
  int *parent = malloc((size_t)nranks * sizeof *parent), *cluster = malloc((size_t)nranks * sizeof *cluster);
  rc = pu && tile && parent && cluster ? 0 : -ENOMEM;
  for (int r = 0; rc == 0 && r < nranks; r++) {
    pu[r] = plan->ranks[r].pu;
    tile[r] = plan->ranks[r].pu >= 0 ? tree_rank_tile(topo, &plan->ranks[r]) : -1;
    cluster[r] = plan->ranks[r].pu >= 0 ? plan->ranks[r].cluster : -1;
  }
  if (rc == 0) rc = coll_tree_build(nranks, pu, tile, cluster, parent) == 0 ? 0 : -ENOMEM;
  char *text = NULL;
  size_t len = 0;
  FILE *f = rc == 0 ? open_memstream(&text, &len) : NULL;
  if (rc == 0 && f == NULL) rc = -ENOMEM;
  if (f) {
    tree_render(f, nranks, pu, tile, parent, json);
    rc = fclose(f) == 0 ? 0 : -ENOMEM;
    if (rc == 0) *text_p = text;
    else free(text);
  }
  free(pu), free(tile), free(cluster), free(parent);
  coll_numa_plan_free(plan);
  coll_numa_topo_free(topo);
  return rc;
}
