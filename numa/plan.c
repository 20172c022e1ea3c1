/*
 * plan.c - step 2: a pure function from (topology facts, ranks, policy) to a
 * placement plan. No hwloc, no memkind, no system calls, no environment.
 *
 * HBM nodes. A user list replaces detection entirely (nodes it names that
 * the topology lacks are dropped with a note). Otherwise a node is HBM when
 * its subtype is MCDRAM or HBM (hwloc 2.x on KNL), or when its bandwidth is
 * at least twice the lowest bandwidth among the other nodes that share one of
 * its localities (Xeon Max in flat mode, where only HMAT tells them apart).
 *
 * Memory mode. From what was found: HBM nodes and memory-side caches ->
 * hybrid, HBM only -> flat, caches only -> cache (caches: hwloc's, or, when
 * hwloc showed none, the kernel's sysfs memory_side_cache entries discovery
 * recorded, counted when they front a DDR (non-HBM) node); hwloc's MemoryMode
 * info (Flat, Cache, Hybrid*), when present, is checked against it and a
 * disagreement noted.
 *
 * Per cluster: its HBM node is the HBM node with the same locality (else one
 * whose locality includes it, else one in the same package, else the first),
 * largest first; its DDR node likewise among non-HBM nodes.
 *
 * Ranks. The number of ranks per cluster is dealt one at a time, visiting
 * clusters interleaved by package (p0c0, p1c0, p0c1, p1c1, ...) so packages
 * and clusters get even shares; a cluster takes no second rank per core until
 * every cluster's cores are taken ("level" below). Ranks are then numbered in
 * blocks cluster by cluster (neighbouring ranks share a cluster, which is what
 * the tree algorithms want). Inside a cluster with k ranks on C cores, the
 * ranks of each level are spread over the cores (core floor(i*C/m) for the
 * i-th of m ranks of that level: on KNL this spreads over tiles before
 * doubling up inside one), taking the level-th hardware thread of the core.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <numaif.h>

#include "numa_internal.h"

void coll__numa_addnote(char *notes, size_t cap, const char *fmt, ...) {
  size_t len = strlen(notes);
  if (len + 2 >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(notes + len, cap - len - 1, fmt, ap);
  va_end(ap);
  if (n < 0)
    return;
  len = strlen(notes);
  notes[len] = '\n';
  notes[len + 1] = '\0';
}

/* The one list of policy words: the parser, the names, the launcher's and the topo CLI's
 * choices (coll_numa_policy_words) all read these. Aliases follow the word they stand for. */
typedef struct {
  const char *word;
  int value;
} plan_word_t;
static const plan_word_t plan_memory_words[] = {
    {"auto", COLL_NUMA_MEM_AUTO},           {"hbm_bind", COLL_NUMA_MEM_HBM_BIND},
    {"hbm_preferred", COLL_NUMA_MEM_HBM_PREFERRED}, {"hbm", COLL_NUMA_MEM_HBM_PREFERRED},
    {"hbm_interleave", COLL_NUMA_MEM_HBM_INTERLEAVE}, {"ddr", COLL_NUMA_MEM_DDR}, {NULL, 0}};
static const plan_word_t plan_bind_words[] = {
    {"share", COLL_NUMA_BIND_SHARE},     {"core", COLL_NUMA_BIND_CORE},
    {"cluster", COLL_NUMA_BIND_CLUSTER}, {"quadrant", COLL_NUMA_BIND_CLUSTER},
    {"none", COLL_NUMA_BIND_NONE},       {NULL, 0}};

static const char *plan_word_name(const plan_word_t *words, int value) {
  for (; words->word; words++)
    if (words->value == value) return words->word;
  return "?";
}

/* 0 and *value_p for a word of the list (any case); NULL or "" is the first. */
static int plan_word_parse(const plan_word_t *words, const char *word, int *value_p) {
  if (word == NULL || *word == '\0') {
    *value_p = words[0].value;
    return 0;
  }
  for (; words->word; words++)
    if (!strcasecmp(word, words->word)) {
      *value_p = words->value;
      return 0;
    }
  return -EINVAL;
}

const char *coll_numa_policy_word(int bind, int i) {
  const plan_word_t *words = bind ? plan_bind_words : plan_memory_words;
  if (i < 0) return NULL;
  for (int k = 0; k < i; k++)
    if (words[k].word == NULL) return NULL;
  return words[i].word;
}

const char *coll_numa_memory_name(coll_numa_memory_t memory) {
  return plan_word_name(plan_memory_words, (int)memory);
}

const char *coll_numa_bind_name(coll_numa_bind_t bind) {
  return plan_word_name(plan_bind_words, (int)bind);
}

const char *coll__numa_mode_name(coll_numa_mode_t mode) {
  switch (mode) {
  case COLL_NUMA_MODE_NONE: return "none";
  case COLL_NUMA_MODE_FLAT: return "flat";
  case COLL_NUMA_MODE_CACHE: return "cache";
  case COLL_NUMA_MODE_HYBRID: return "hybrid";
  }
  return "?";
}

/* Parse "0-3,8" into a sorted list of distinct values; -EINVAL if not a list. */
static int plan_parse_list(const char *s, unsigned *out, int cap, int *n_p) {
  int n = 0;
  const char *p = s;
  while (*p != '\0') {
    char *end;
    if (*p < '0' || *p > '9')
      return -EINVAL;
    unsigned long a = strtoul(p, &end, 10), b = a;
    p = end;
    if (*p == '-') {
      p++;
      if (*p < '0' || *p > '9')
        return -EINVAL;
      b = strtoul(p, &end, 10);
      p = end;
    }
    if (a > b || b > 65535)
      return -EINVAL;
    for (unsigned long v = a; v <= b; v++) {
      int dup = 0;
      for (int i = 0; i < n; i++)
        dup |= out[i] == v;
      if (!dup) {
        if (n == cap)
          return -EINVAL;
        out[n++] = (unsigned)v;
      }
    }
    if (*p == ',')
      p++;
    else if (*p != '\0')
      return -EINVAL;
  }
  for (int i = 1; i < n; i++) /* insertion sort, lists are short */
    for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
      unsigned x = out[j];
      out[j] = out[j - 1];
      out[j - 1] = x;
    }
  *n_p = n;
  return 0;
}

int coll_numa_policy_parse(const char *memory, const char *bind, const char *hbm_nodes,
                           coll_numa_policy_t *policy_p) {
  coll_numa_policy_t p;
  memset(&p, 0, sizeof(p));
  int memory_v, bind_v;
  if (plan_word_parse(plan_memory_words, memory, &memory_v) || plan_word_parse(plan_bind_words, bind, &bind_v))
    return -EINVAL;
  p.memory = (coll_numa_memory_t)memory_v;
  p.bind = (coll_numa_bind_t)bind_v;
  if (hbm_nodes != NULL && *hbm_nodes != '\0') {
    unsigned tmp[1024];
    int n;
    if (strlen(hbm_nodes) >= sizeof(p.hbm_nodes) || plan_parse_list(hbm_nodes, tmp, 1024, &n) != 0)
      return -EINVAL;
    snprintf(p.hbm_nodes, sizeof(p.hbm_nodes), "%s", hbm_nodes);
  }
  *policy_p = p;
  return 0;
}

int coll_numa_policy_from_env(const char *memory, const char *bind, coll_numa_policy_t *policy_p) {
  const char *m = memory ? memory : getenv("HBMCOLL_MEMORY");
  const char *b = bind ? bind : getenv("HBMCOLL_BIND");
  const char *from = NULL, *h = getenv("HBMCOLL_HBM_NODES");
  if (h != NULL && *h != '\0')
    from = "HBMCOLL_HBM_NODES";
  else if ((h = getenv("MEMKIND_HBW_NODES")) != NULL && *h != '\0')
    from = "MEMKIND_HBW_NODES";
  else
    h = NULL;
  coll_numa_policy_t p;
  int rc = coll_numa_policy_parse(m, b, h, &p);
  if (rc != 0)
    return rc;
  p.hbm_nodes_from = from;
  *policy_p = p;
  return 0;
}

static int plan_node_index(const coll_numa_topo_t *topo, unsigned os) {
  for (int i = 0; i < topo->nnodes; i++)
    if (topo->nodes[i].os_index == os)
      return i;
  return -1;
}

static int plan_is_hbm_subtype(const char *s) {
  return !strcasecmp(s, "MCDRAM") || !strcasecmp(s, "HBM");
}

/* Lowest bandwidth among the other nodes sharing a locality with node i. */
static uint64_t plan_local_ref_bw(const coll_numa_topo_t *topo, int i) {
  uint64_t ref = 0;
  const coll_numa_node_t *n = &topo->nodes[i];
  for (int j = 0; j < topo->nnodes; j++) {
    const coll_numa_node_t *m = &topo->nodes[j];
    if (j == i || m->bandwidth == 0)
      continue;
    int shared = 0;
    for (int c = 0; c < topo->nclusters && !shared; c++)
      shared = n->loc[c] == COLL_NUMA_LOC_SAME && m->loc[c] == COLL_NUMA_LOC_SAME;
    if (shared && (ref == 0 || m->bandwidth < ref))
      ref = m->bandwidth;
  }
  return ref;
}

/* Node index of the best node for cluster c among nodes with is_hbm == want. */
static int plan_pick_node(const coll_numa_topo_t *topo, const char *is_hbm, int c, int want) {
  int best = -1, best_score = -1;
  for (int i = 0; i < topo->nnodes; i++) {
    const coll_numa_node_t *n = &topo->nodes[i];
    if ((is_hbm[i] != 0) != (want != 0))
      continue;
    int score = n->loc[c] == COLL_NUMA_LOC_SAME ? 3
                : n->loc[c] == COLL_NUMA_LOC_WIDER ? 2
                : (n->package >= 0 && n->package == topo->clusters[c].package) ? 1 : 0;
    if (score > best_score || (score == best_score && n->size > topo->nodes[best].size)) {
      best = i;
      best_score = score;
    }
  }
  return best;
}

int coll__numa_place_for(const coll_numa_topo_t *topo, const coll_numa_plan_t *plan, int cluster,
                         coll_numa_place_t *place_p) {
  coll_numa_place_t p;
  memset(&p, 0, sizeof(p));
  p.cluster = cluster;
  switch (plan->effective) {
  case COLL_NUMA_MEM_HBM_INTERLEAVE:
    p.mode = MPOL_INTERLEAVE;
    for (int i = 0; i < plan->nhbm && i < 64; i++)
      p.nodes[p.nnodes++] = plan->hbm[i];
    p.is_hbm = 1;
    break;
  case COLL_NUMA_MEM_HBM_BIND:
  case COLL_NUMA_MEM_HBM_PREFERRED:
    p.mode = plan->effective == COLL_NUMA_MEM_HBM_BIND ? MPOL_BIND : MPOL_PREFERRED;
    p.nodes[p.nnodes++] = topo->nodes[plan->cl_hbm[cluster]].os_index;
    p.is_hbm = 1;
    break;
  default:
    p.mode = MPOL_PREFERRED;
    p.nodes[p.nnodes++] = topo->nodes[plan->cl_ddr[cluster]].os_index;
    break;
  }
  *place_p = p;
  return 0;
}

/* Cluster with the most users (ties: the lowest cluster index). */
int coll__numa_segment_cluster(const coll_numa_plan_t *plan, const int *user_ranks, int nusers) {
  int best = -1, best_n = 0;
  int ncl = 0;
  for (int r = 0; r < plan->nranks; r++)
    if (plan->ranks[r].cluster + 1 > ncl)
      ncl = plan->ranks[r].cluster + 1;
  for (int c = 0; c < ncl; c++) {
    int n = 0;
    if (user_ranks == NULL || nusers <= 0) {
      for (int r = 0; r < plan->nranks; r++)
        n += plan->ranks[r].cluster == c;
    } else {
      for (int u = 0; u < nusers; u++)
        n += plan->ranks[user_ranks[u]].cluster == c;
    }
    if (n > best_n) {
      best_n = n;
      best = c;
    }
  }
  return best < 0 ? 0 : best;
}

static int plan_hbm(const coll_numa_topo_t *topo, coll_numa_plan_t *plan) {
  const coll_numa_policy_t *pol = &plan->policy;
  if (pol->hbm_nodes[0] != '\0') {
    unsigned list[1024];
    int n = 0;
    if (plan_parse_list(pol->hbm_nodes, list, 1024, &n) != 0)
      return -EINVAL;
    const char *from = pol->hbm_nodes_from ? pol->hbm_nodes_from : "the HBM node list";
    int found = 0;
    for (int k = 0; k < n; k++) {
      int i = plan_node_index(topo, list[k]);
      if (i < 0) {
        coll__numa_addnote(plan->notes, sizeof(plan->notes),
                           "%s names node %u, which this topology does not have: ignored", from,
                           list[k]);
        continue;
      }
      plan->is_hbm[i] = 1;
      found++;
    }
    if (found == 0)
      return -EINVAL;
    coll__numa_addnote(plan->notes, sizeof(plan->notes), "HBM nodes taken from %s=%s", from,
                       pol->hbm_nodes);
    return 0;
  }
  for (int i = 0; i < topo->nnodes; i++) {
    const coll_numa_node_t *n = &topo->nodes[i];
    if (plan_is_hbm_subtype(n->subtype)) {
      plan->is_hbm[i] = 1;
      continue;
    }
    uint64_t ref = plan_local_ref_bw(topo, i);
    if (n->bandwidth > 0 && ref > 0 && n->bandwidth >= 2 * ref)
      plan->is_hbm[i] = 1;
  }
  return 0;
}

static void plan_mode(const coll_numa_topo_t *topo, coll_numa_plan_t *plan) {
  const char *mm = topo->memory_mode;
  int found = topo->nmemcaches > 0;
  if (topo->memcache_sysfs) { /* the kernel's caches count when they front a non-HBM node */
    found = 0;
    for (int i = 0; i < topo->nnodes; i++)
      found |= topo->nodes[i].behind_memcache && !plan->is_hbm[i];
  }
  int caches = found || !strncasecmp(mm, "Hybrid", 6) || !strcasecmp(mm, "Cache");
  if (plan->nhbm > 0)
    plan->mode = caches ? COLL_NUMA_MODE_HYBRID : COLL_NUMA_MODE_FLAT;
  else
    plan->mode = caches ? COLL_NUMA_MODE_CACHE : COLL_NUMA_MODE_NONE;
  if (mm[0] != '\0' && plan->policy.hbm_nodes[0] == '\0') {
    coll_numa_mode_t said = !strcasecmp(mm, "Flat") ? COLL_NUMA_MODE_FLAT
                            : !strcasecmp(mm, "Cache") ? COLL_NUMA_MODE_CACHE
                            : !strncasecmp(mm, "Hybrid", 6) ? COLL_NUMA_MODE_HYBRID
                                                            : plan->mode;
    if (said != plan->mode && topo->memcache_sysfs)
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "hwloc says MemoryMode=%s but the kernel shows %d memory-side cache(s) "
                         "(sysfs memory_side_cache) hwloc does not: using %s",
                         mm, topo->nmemcaches, coll__numa_mode_name(plan->mode));
    else if (said != plan->mode)
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "hwloc says MemoryMode=%s but the NUMA nodes found mean %s: using %s", mm,
                         coll__numa_mode_name(plan->mode), coll__numa_mode_name(plan->mode));
  }
}

/* Deal nranks over the clusters; cnt[c] ranks for cluster c. */
static void plan_deal(const coll_numa_topo_t *topo, int nranks, int *cnt) {
  int ncl = topo->nclusters, npk = 0;
  int *order = calloc((size_t)ncl, sizeof(int)), no = 0;
  if (order == NULL) { /* fall back to plain cluster order */
    for (int r = 0; r < nranks; r++)
      cnt[r % ncl]++;
    return;
  }
  for (int c = 0; c < ncl; c++)
    if (topo->clusters[c].package + 1 > npk)
      npk = topo->clusters[c].package + 1;
  /* per package, clusters in order; visit j-th cluster of each package */
  for (int j = 0; no < ncl && j <= ncl; j++) {
    for (int p = -1; p < npk; p++) {
      int seen = 0;
      for (int c = 0; c < ncl; c++) {
        if (topo->clusters[c].package != p)
          continue;
        if (seen++ == j)
          order[no++] = c;
      }
    }
  }
  int assigned = 0;
  for (long level = 1; assigned < nranks; level++) {
    int progress = 1;
    while (progress && assigned < nranks) {
      progress = 0;
      for (int k = 0; k < no && assigned < nranks; k++) {
        int c = order[k];
        if (cnt[c] < level * topo->clusters[c].ncores) {
          cnt[c]++;
          assigned++;
          progress = 1;
        }
      }
    }
  }
  free(order);
}

static int plan_ranks(const coll_numa_topo_t *topo, coll_numa_plan_t *plan) {
  int ncl = topo->nclusters, r = 0;
  int *cnt = calloc((size_t)ncl, sizeof(int)), *first = calloc((size_t)ncl, sizeof(int));
  if (cnt == NULL || first == NULL) {
    free(cnt);
    free(first);
    return -ENOMEM;
  }
  plan_deal(topo, plan->nranks, cnt);
  for (int c = 0; c < ncl; c++) {
    const coll_numa_cluster_t *k = &topo->clusters[c];
    int C = k->ncores, P = 0;
    for (int i = 0; i < C; i++)
      P += k->cores[i].npus;
    if (cnt[c] > P && plan->policy.bind != COLL_NUMA_BIND_CLUSTER &&
        plan->policy.bind != COLL_NUMA_BIND_NONE)
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "%d ranks on the %d PUs of cluster %d: bound to the cluster, not a core "
                         "each, so a woken rank can run on any idle PU", cnt[c], P, c);
    first[c] = r;
    for (int j = 0; j < cnt[c]; j++, r++) {
      int level = j / C, i = j % C;
      int m = cnt[c] - level * C < C ? cnt[c] - level * C : C;
      int core = (int)((long)i * C / m);
      coll_numa_rank_t *rk = &plan->ranks[r];
      rk->cluster = c;
      rk->core = core;
      rk->pu = plan->policy.bind == COLL_NUMA_BIND_NONE
                   ? -1
                   : (int)k->cores[core].pus[level % k->cores[core].npus];
      coll__numa_place_for(topo, plan, c, &rk->buf);
    }
  }
  int rc = coll__numa_plan_cpusets(topo, plan, cnt, first);
  free(cnt);
  free(first);
  return rc;
}

void coll_numa_plan_free(coll_numa_plan_t *plan) {
  if (plan == NULL)
    return;
  free(plan->hbm);
  free(plan->is_hbm);
  free(plan->cl_hbm);
  free(plan->cl_ddr);
  for (int r = 0; plan->ranks && r < plan->nranks; r++)
    free(plan->ranks[r].cpus);
  free(plan->ranks);
  free(plan);
}

int coll_numa_plan_make(const coll_numa_topo_t *topo, int nranks, const coll_numa_policy_t *policy,
                        coll_numa_plan_t **plan_p) {
  if (topo == NULL || policy == NULL || nranks < 1 || nranks > COLL_NUMA_RANKS_MAX || topo->nclusters < 1 ||
      topo->nnodes < 1 || coll_numa_topo_ncores(topo) < 1)
    return -EINVAL;
  int rc = -ENOMEM, ncl = topo->nclusters;
  coll_numa_plan_t *plan = calloc(1, sizeof(*plan));
  if (plan == NULL)
    return -ENOMEM;
  plan->policy = *policy;
  plan->nranks = nranks;
  plan->is_hbm = calloc((size_t)topo->nnodes, 1);
  plan->hbm = calloc((size_t)topo->nnodes, sizeof(unsigned));
  plan->cl_hbm = calloc((size_t)ncl, sizeof(int));
  plan->cl_ddr = calloc((size_t)ncl, sizeof(int));
  plan->ranks = calloc((size_t)nranks, sizeof(coll_numa_rank_t));
  if (!plan->is_hbm || !plan->hbm || !plan->cl_hbm || !plan->cl_ddr || !plan->ranks)
    goto out_plan;
  if (topo->note[0] != '\0')
    coll__numa_addnote(plan->notes, sizeof(plan->notes), "%s", topo->note);
  if ((rc = plan_hbm(topo, plan)) != 0)
    goto out_plan;
  for (int i = 0; i < topo->nnodes; i++)
    if (plan->is_hbm[i])
      plan->hbm[plan->nhbm++] = topo->nodes[i].os_index;
  plan_mode(topo, plan);

  for (int c = 0; c < ncl; c++) {
    plan->cl_hbm[c] = plan_pick_node(topo, plan->is_hbm, c, 1);
    plan->cl_ddr[c] = plan_pick_node(topo, plan->is_hbm, c, 0);
    if (plan->cl_ddr[c] < 0) /* every node is "HBM" (user list): DDR is the local HBM node */
      plan->cl_ddr[c] = plan->cl_hbm[c];
  }

  /* effective memory policy */
  coll_numa_memory_t m = policy->memory;
  if (plan->nhbm == 0) {
    if (m != COLL_NUMA_MEM_DDR && m != COLL_NUMA_MEM_AUTO)
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "memory policy %s asks for HBM but there is no HBM node: using DDR",
                         coll_numa_memory_name(m));
    if (plan->mode == COLL_NUMA_MODE_CACHE)
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "memory mode cache: HBM is a memory-side cache in front of DDR, not a NUMA "
                         "node of its own: buffers use DDR");
    else
      coll__numa_addnote(plan->notes, sizeof(plan->notes),
                         "no HBM on this machine (no MCDRAM/HBM node, none with >= 2x DDR bandwidth, "
                         "no HBMCOLL_HBM_NODES): buffers use DDR");
    m = COLL_NUMA_MEM_DDR;
  } else if (m == COLL_NUMA_MEM_AUTO) {
    m = COLL_NUMA_MEM_HBM_PREFERRED;
  }
  plan->effective = m;
  if ((rc = plan_ranks(topo, plan)) != 0)
    goto out_plan;
  *plan_p = plan;
  return 0;

out_plan:
  coll_numa_plan_free(plan);
  return rc;
}
