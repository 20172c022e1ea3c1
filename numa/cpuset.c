/*
 * cpuset.c - part of step 2 (plan.c): the CPU set and thread count of every
 * rank, once plan.c has dealt the ranks to clusters and put each on a core.
 * Pure: reads nothing but its arguments.
 */
#include <errno.h>
#include <stdlib.h>

#include "numa_internal.h"

/* Add cores [first, first+n) of cluster k to the rank's CPU set. */
static int plan_add_cores(coll_numa_rank_t *rk, const coll_numa_cluster_t *k, int first, int n) {
  int add = 0;
  for (int c = first; c < first + n && c < k->ncores; c++)
    add += k->cores[c].npus;
  unsigned *grown = realloc(rk->cpus, (size_t)(rk->ncpus + add) * sizeof(unsigned));
  if (grown == NULL && add > 0)
    return -ENOMEM;
  rk->cpus = grown;
  for (int c = first; c < first + n && c < k->ncores; c++, rk->threads++)
    for (int i = 0; i < k->cores[c].npus; i++)
      rk->cpus[rk->ncpus++] = k->cores[c].pus[i];
  return 0;
}

/* Cores of a cluster dealt to its ranks first .. first+cnt-1 as shares: the
 * i-th gets cores floor(i*C/cnt) .. floor((i+1)*C/cnt) - 1 (its first core is
 * where plan_ranks put its PU). With more ranks than cores each gets its own
 * core, and with more ranks than PUs each gets the whole cluster (several
 * ranks pinned to one PU would make every wait cost a time slice). */
static int plan_share(coll_numa_plan_t *plan, const coll_numa_cluster_t *k, int first, int cnt) {
  int C = k->ncores, P = 0, rc = 0;
  for (int i = 0; i < C; i++)
    P += k->cores[i].npus;
  for (int i = 0; i < cnt && rc == 0; i++) {
    coll_numa_rank_t *rk = &plan->ranks[first + i];
    if (cnt > P) {
      rc = plan_add_cores(rk, k, 0, C);
      rk->threads = 1; /* more ranks than PUs: one thread each is already too many */
      continue;
    }
    if (cnt > C)
      rc = plan_add_cores(rk, k, rk->core, 1);
    else
      rc = plan_add_cores(rk, k, (int)((long)i * C / cnt),
                          (int)((long)(i + 1) * C / cnt) - (int)((long)i * C / cnt));
  }
  return rc;
}

static int plan_cmp_unsigned(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return (x > y) - (x < y);
}

/* Every rank's CPU set and thread count. share: the rank's share of its
 * cluster, and a cluster nobody was dealt (fewer ranks than clusters) is
 * shared out to the ranks of the first cluster in its package that has some
 * (else of the first that has some), so a lone rank gets the whole machine;
 * core: its core; cluster: its cluster; none: no set, the machine's cores
 * over the ranks as threads. */
int coll__numa_plan_cpusets(const coll_numa_topo_t *topo, coll_numa_plan_t *plan, const int *cnt,
                            const int *first) {
  coll_numa_bind_t bind = plan->policy.bind;
  int ncl = topo->nclusters, rc = 0;
  for (int c = 0; c < ncl && rc == 0; c++) {
    const coll_numa_cluster_t *k = &topo->clusters[c];
    if (bind == COLL_NUMA_BIND_SHARE && cnt[c] > 0) {
      rc = plan_share(plan, k, first[c], cnt[c]);
    } else if (bind == COLL_NUMA_BIND_SHARE) {
      int to = -1;
      for (int d = 0; d < ncl && to < 0; d++)
        if (cnt[d] > 0 && topo->clusters[d].package == k->package)
          to = d;
      for (int d = 0; d < ncl && to < 0; d++)
        if (cnt[d] > 0)
          to = d;
      if (to >= 0)
        rc = plan_share(plan, k, first[to], cnt[to]);
    } else if (bind == COLL_NUMA_BIND_CORE) {
      int P = 0;
      for (int i = 0; i < k->ncores; i++)
        P += k->cores[i].npus;
      for (int j = 0; j < cnt[c] && rc == 0; j++) {
        coll_numa_rank_t *rk = &plan->ranks[first[c] + j];
        rc = cnt[c] > P ? plan_add_cores(rk, k, 0, k->ncores) : plan_add_cores(rk, k, rk->core, 1);
        rk->threads = 1;
      }
    } else if (bind == COLL_NUMA_BIND_CLUSTER) {
      for (int j = 0; j < cnt[c] && rc == 0; j++) {
        coll_numa_rank_t *rk = &plan->ranks[first[c] + j];
        rc = plan_add_cores(rk, k, 0, k->ncores);
        rk->threads = k->ncores / cnt[c]; /* a thread per core, the cores over the ranks */
      }
    }
  }
  int all_cores = coll_numa_topo_ncores(topo);
  for (int r = 0; r < plan->nranks; r++) {
    coll_numa_rank_t *rk = &plan->ranks[r];
    if (bind == COLL_NUMA_BIND_NONE)
      rk->threads = all_cores / plan->nranks;
    if (rk->threads < 1)
      rk->threads = 1;
    if (rk->ncpus > 1)
      qsort(rk->cpus, (size_t)rk->ncpus, sizeof(unsigned), plan_cmp_unsigned);
  }
  return rc;
}

