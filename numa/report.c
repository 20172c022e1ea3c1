/*
 * report.c - the plan as JSON (for tools and golden tests) and as a human
 * report (python -m hbmcoll.topo, build/coll-topo). Library code never
 * prints: both come back as a malloc'ed string.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <numaif.h>

#include "numa_internal.h"

void coll__numa_str_add(coll_numa_str_t *s, const char *fmt, ...) {
  if (s->oom)
    return;
  for (;;) {
    va_list ap;
    size_t room = s->cap - s->len;
    va_start(ap, fmt);
    int n = s->buf ? vsnprintf(s->buf + s->len, room, fmt, ap) : -1;
    va_end(ap);
    if (s->buf != NULL && n >= 0 && (size_t)n < room) {
      s->len += (size_t)n;
      return;
    }
    size_t cap = s->cap ? s->cap * 2 : 1024;
    while (n >= 0 && cap < s->len + (size_t)n + 1)
      cap *= 2;
    char *b = realloc(s->buf, cap);
    if (b == NULL) {
      s->oom = 1;
      return;
    }
    if (s->buf == NULL)
      b[0] = '\0';
    s->buf = b;
    s->cap = cap;
  }
}

static void report_json_str(coll_numa_str_t *s, const char *v) {
  coll__numa_str_add(s, "\"");
  for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
    if (*p == '"' || *p == '\\')
      coll__numa_str_add(s, "\\%c", *p);
    else if (*p < 0x20)
      coll__numa_str_add(s, "\\u%04x", *p);
    else
      coll__numa_str_add(s, "%c", *p);
  }
  coll__numa_str_add(s, "\"");
}

static void report_nodes(coll_numa_str_t *s, const unsigned *nodes, int n) {
  for (int i = 0; i < n; i++)
    coll__numa_str_add(s, "%s%u", i ? ", " : "", nodes[i]);
}

/* notes: lines ending in '\n' */
static void report_json_notes(coll_numa_str_t *s, const char *notes) {
  coll__numa_str_add(s, ",\n  \"notices\": [");
  int first = 1;
  for (const char *p = notes; *p;) {
    const char *e = strchr(p, '\n');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    char line[COLL_NUMA_NOTES_MAX];
    snprintf(line, sizeof(line), "%.*s", (int)n, p);
    coll__numa_str_add(s, "%s", first ? "" : ", ");
    report_json_str(s, line);
    first = 0;
    p += n + (e != NULL);
  }
  coll__numa_str_add(s, "]");
}

/* The rank's CPU set as a sorted hwloc-style list ("0-3,64-67"); quoted for
 * JSON; null / "any" with bind none. */
static void report_cpus(coll_numa_str_t *s, const coll_numa_topo_t *topo, const coll_numa_rank_t *rk,
                        int json) {
  if (rk->ncpus == 0) {
    coll__numa_str_add(s, json ? "null" : "any");
    return;
  }
  (void)topo;
  const unsigned *ids = rk->cpus; /* sorted by the plan */
  int n = rk->ncpus;
  coll__numa_str_add(s, json ? "\"" : "");
  for (int i = 0; i < n;) {
    int j = i;
    while (j + 1 < n && ids[j + 1] == ids[j] + 1)
      j++;
    coll__numa_str_add(s, "%s%u", i ? "," : "", ids[i]);
    if (j > i)
      coll__numa_str_add(s, "-%u", ids[j]);
    i = j + 1;
  }
  coll__numa_str_add(s, json ? "\"" : "");
}

/* Per cluster, before the per-rank lines: how many ranks, how many cores each. */
static void report_clusters(coll_numa_str_t *s, const coll_numa_topo_t *topo,
                            const coll_numa_plan_t *plan) {
  for (int c = 0; c < topo->nclusters; c++) {
    int n = 0, first = -1, last = -1, tmin = 1 << 30, tmax = 0;
    for (int r = 0; r < plan->nranks; r++) {
      const coll_numa_rank_t *rk = &plan->ranks[r];
      if (rk->cluster != c)
        continue;
      if (first < 0)
        first = r;
      last = r;
      n++;
      tmin = rk->threads < tmin ? rk->threads : tmin;
      tmax = rk->threads > tmax ? rk->threads : tmax;
    }
    if (n == 0)
      continue;
    coll__numa_str_add(s, "    cluster %d (%d cores): ", c, topo->clusters[c].ncores);
    if (n == 1)
      coll__numa_str_add(s, "rank %d, %d", first, tmin);
    else
      coll__numa_str_add(s, "ranks %d-%d (%d), %d", first, last, n, tmin);
    if (tmax != tmin)
      coll__numa_str_add(s, "-%d", tmax);
    coll__numa_str_add(s, " thread%s each, buffers on node ", tmax == 1 ? "" : "s");
    report_nodes(s, plan->ranks[first].buf.nodes, plan->ranks[first].buf.nnodes);
    coll__numa_str_add(s, " (%s)\n", plan->ranks[first].buf.is_hbm ? "HBM" : "DDR");
  }
}

static void report_json(coll_numa_str_t *s, const coll_numa_topo_t *topo, const coll_numa_plan_t *plan) {
  coll__numa_str_add(s, "{\n  \"memory_mode\": \"%s\",\n  \"cluster_mode\": ", coll__numa_mode_name(plan->mode));
  if (topo->cluster_mode[0] != '\0')
    report_json_str(s, topo->cluster_mode);
  else
    coll__numa_str_add(s, "null");
  coll__numa_str_add(s, ",\n  \"hbm_nodes\": [");
  report_nodes(s, plan->hbm, plan->nhbm);
  coll__numa_str_add(s, "],\n  \"ranks\": [");
  for (int r = 0; r < plan->nranks; r++) {
    const coll_numa_rank_t *rk = &plan->ranks[r];
    coll__numa_str_add(s, "%s\n    {\"rank\": %d, \"pu\": ", r ? "," : "", r);
    if (rk->pu >= 0)
      coll__numa_str_add(s, "%d", rk->pu);
    else
      coll__numa_str_add(s, "null");
    coll__numa_str_add(s, ", \"cpus\": ");
    report_cpus(s, topo, rk, 1);
    coll__numa_str_add(s, ", \"threads\": %d, \"buffer_nodes\": [", rk->threads);
    report_nodes(s, rk->buf.nodes, rk->buf.nnodes);
    coll__numa_str_add(s, "]}");
  }
  coll__numa_str_add(s, "\n  ]");
}

static void report_size(char *buf, size_t cap, uint64_t b) {
  if (b >= (1ull << 30))
    snprintf(buf, cap, "%.1f GiB", (double)b / (double)(1ull << 30));
  else
    snprintf(buf, cap, "%.0f MiB", (double)b / (double)(1ull << 20));
}

static const char *report_mpol(int mode) {
  return mode == MPOL_BIND ? "bind" : mode == MPOL_INTERLEAVE ? "interleave" : "preferred";
}

static void report_text(coll_numa_str_t *s, const coll_numa_topo_t *topo, const coll_numa_plan_t *plan,
                        const char *notes) {
  char a[32], b[32];
  coll__numa_str_add(s, "hbmcoll topology: %s\n", topo->source);
  coll__numa_str_add(s, "  memory mode:  %s", coll__numa_mode_name(plan->mode));
  if (topo->memory_mode[0])
    coll__numa_str_add(s, " (hwloc MemoryMode=%s)", topo->memory_mode);
  coll__numa_str_add(s, "\n  cluster mode: %s\n", topo->cluster_mode[0] ? topo->cluster_mode : "not reported");
  coll__numa_str_add(s, "  packages: %d, clusters: %d, cores: %d\n", topo->npackages, topo->nclusters,
                     coll_numa_topo_ncores(topo));
  if (topo->nmemcaches > 0) {
    report_size(a, sizeof(a), topo->memcache_bytes);
    coll__numa_str_add(s, "  memory-side caches: %d, %s in total%s\n", topo->nmemcaches, a,
                       topo->memcache_sysfs ? " (from sysfs memory_side_cache; hwloc shows none)" : "");
  } else {
    coll__numa_str_add(s, "  memory-side caches: none\n");
  }
  coll__numa_str_add(s, "  NUMA nodes:\n");
  for (int i = 0; i < topo->nnodes; i++) {
    const coll_numa_node_t *n = &topo->nodes[i];
    report_size(a, sizeof(a), n->size);
    if (n->free)
      report_size(b, sizeof(b), n->free);
    coll__numa_str_add(s, "    node %-3u %-4s %10s  free %-10s", n->os_index, plan->is_hbm[i] ? "HBM" : "DDR",
                       a, n->free ? b : "n/a");
    if (n->bandwidth)
      coll__numa_str_add(s, "  %llu MiB/s", (unsigned long long)n->bandwidth);
    if (n->subtype[0])
      coll__numa_str_add(s, "  subtype %s", n->subtype);
    if (n->behind_memcache)
      coll__numa_str_add(s, "  (behind a memory-side cache)");
    coll__numa_str_add(s, "  CPUs %s\n", n->cpus[0] ? n->cpus : "none");
  }
  if (plan->nhbm > 0) {
    coll__numa_str_add(s, "  HBM nodes: ");
    report_nodes(s, plan->hbm, plan->nhbm);
    coll__numa_str_add(s, "\n");
  } else if (plan->mode == COLL_NUMA_MODE_CACHE) {
    coll__numa_str_add(s, "  HBM: none as a NUMA node: it is a memory-side cache in front of DDR; "
                          "buffers use DDR\n");
  } else {
    coll__numa_str_add(s, "  HBM: none: this machine has no high-bandwidth memory; buffers use DDR\n");
  }
  coll__numa_str_add(s, "  plan for %d local rank%s: bind %s, memory %s", plan->nranks,
                     plan->nranks == 1 ? "" : "s", coll_numa_bind_name(plan->policy.bind),
                     coll_numa_memory_name(plan->policy.memory));
  if (plan->effective != plan->policy.memory)
    coll__numa_str_add(s, " -> %s", coll_numa_memory_name(plan->effective));
  coll__numa_str_add(s, "\n");
  report_clusters(s, topo, plan);
  for (int r = 0; r < plan->nranks; r++) {
    const coll_numa_rank_t *rk = &plan->ranks[r];
    coll__numa_str_add(s, "    rank %-3d CPUs ", r);
    report_cpus(s, topo, rk, 0);
    coll__numa_str_add(s, "  threads %d  cluster %d  buffers on node ", rk->threads, rk->cluster);
    report_nodes(s, rk->buf.nodes, rk->buf.nnodes);
    coll__numa_str_add(s, " (%s, %s)\n", rk->buf.is_hbm ? "HBM" : "DDR", report_mpol(rk->buf.mode));
  }
  if (notes != NULL && notes[0] != '\0') {
    coll__numa_str_add(s, "  notes:\n");
    for (const char *p = notes; *p;) {
      const char *e = strchr(p, '\n');
      size_t n = e ? (size_t)(e - p) : strlen(p);
      coll__numa_str_add(s, "    - %.*s\n", (int)n, p);
      p += n + (e != NULL);
    }
  }
}

static int report_render(const coll_numa_topo_t *topo, const coll_numa_plan_t *plan, int json,
                         const char *notes, int with_notices, char **text_p) {
  coll_numa_str_t s = {0};
  if (json) {
    report_json(&s, topo, plan);
    if (with_notices)
      report_json_notes(&s, notes);
    coll__numa_str_add(&s, "\n}\n");
  } else {
    report_text(&s, topo, plan, notes);
  }
  if (s.oom || s.buf == NULL) {
    free(s.buf);
    return -ENOMEM;
  }
  *text_p = s.buf;
  return 0;
}

int coll_numa_plan_render(const coll_numa_topo_t *topo, const coll_numa_plan_t *plan, int json,
                          char **text_p) {
  if (topo == NULL || plan == NULL || text_p == NULL)
    return -EINVAL;
  return report_render(topo, plan, json, plan->notes, 0, text_p);
}

int coll_numa_ctx_report(const coll_numa_ctx_t *ctx, int json, char **text_p) {
  if (ctx == NULL || text_p == NULL)
    return -EINVAL;
  return report_render(ctx->topo, ctx->plan, json, ctx->notes, 1, text_p);
}

int coll__numa_plan_for(const char *topology_path, int nranks, const char *memory_policy,
                        const char *bind_policy, coll_numa_topo_t **topo_p,
                        coll_numa_plan_t **plan_p) {
  coll_numa_policy_t pol;
  coll_numa_topo_t *topo = NULL;
  int rc;
  if ((rc = coll_numa_policy_from_env(memory_policy, bind_policy, &pol)) != 0)
    return rc;
  if ((rc = coll_numa_topo_load(topology_path, &topo)) != 0)
    return rc;
  if ((rc = coll_numa_plan_make(topo, nranks > 0 ? nranks : coll_numa_topo_ncores(topo), &pol,
                                plan_p)) != 0) {
    coll_numa_topo_free(topo);
    return rc;
  }
  *topo_p = topo;
  return 0;
}

int coll_numa_report(const char *topology_path, int nranks, const char *memory_policy,
                     const char *bind_policy, int json, char **text_p) {
  coll_numa_topo_t *topo = NULL;
  coll_numa_plan_t *plan = NULL;
  if (text_p == NULL)
    return -EINVAL;
  int rc = coll__numa_plan_for(topology_path, nranks, memory_policy, bind_policy, &topo, &plan);
  if (rc == 0)
    rc = coll_numa_plan_render(topo, plan, json, text_p);
  coll_numa_plan_free(plan);
  coll_numa_topo_free(topo);
  return rc;
}
