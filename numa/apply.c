/*
 * apply.c - step 3: put the plan in place on this machine.
 *
 * cpubind through hwloc (only on a topology loaded from this machine);
 * mbind/move_pages through raw system calls (no libnuma needed). Private
 * scratch buffers are scratch.c's.
 *
 * Every refusal degrades instead of failing: a container without
 * CAP_SYS_NICE (Docker's default seccomp profile) makes mbind return EPERM;
 * we then leave memory on the default policy (DDR near the touching CPU) and
 * say so once. An MPOL_BIND larger than the node's free memory gets the
 * process OOM-killed rather than an error, so a strict bind is only used
 * while it fits (with a margin) together with everything this context bound
 * strictly to that node before (libcoll places each rank's arena part as a
 * mapping of its own: one at a time they all fit, together they may not);
 * otherwise MPOL_PREFERRED.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <hwloc.h>
#include <numaif.h>

#include "numa_internal.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif


#define APPLY_MIB (1024.0 * 1024.0)

static long apply_mbind(void *addr, size_t len, int mode, const unsigned long *mask,
                        unsigned long maxnode) {
  return syscall(SYS_mbind, addr, (unsigned long)len, (unsigned long)mode, mask, maxnode, 0UL);
}

static const char *apply_mode_name(int mode) {
  switch (mode) {
  case MPOL_BIND: return "MPOL_BIND";
  case MPOL_PREFERRED: return "MPOL_PREFERRED";
  case MPOL_INTERLEAVE: return "MPOL_INTERLEAVE";
  default: return "MPOL_DEFAULT";
  }
}

static void apply_nodes_str(const coll_numa_place_t *p, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < p->nnodes && len + 8 < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%u", i ? "," : "", p->nodes[i]);
}

static void apply_tell(coll_numa_ctx_t *ctx, char *notice, size_t notice_len, const char *line) {
  if (notice != NULL && notice_len > 0)
    snprintf(notice, notice_len, "%s", line);
  coll__numa_addnote(ctx->notes, sizeof(ctx->notes), "%s", line);
}

static int apply_node_index(const coll_numa_ctx_t *ctx, unsigned os_index) {
  for (int i = 0; i < ctx->topo->nnodes; i++)
    if (ctx->topo->nodes[i].os_index == os_index)
      return i;
  return -1;
}

/* Add (sign > 0) or take off (sign < 0) len bytes strictly bound on the nodes
 * of p to the running totals, spread evenly (a strict bind has one node). */
void coll__numa_charge(coll_numa_ctx_t *ctx, const coll_numa_place_t *p, uint64_t len, int sign) {
  if (ctx->bound_bytes == NULL || p->nnodes < 1)
    return;
  for (int i = 0; i < p->nnodes; i++) {
    int k = apply_node_index(ctx, p->nodes[i]);
    uint64_t part = len / (uint64_t)p->nnodes + (i == 0 ? len % (uint64_t)p->nnodes : 0);
    if (k < 0)
      continue;
    if (sign > 0)
      ctx->bound_bytes[k] += part;
    else
      ctx->bound_bytes[k] = ctx->bound_bytes[k] > part ? ctx->bound_bytes[k] - part : 0;
  }
}

/* Report a capacity fallback on the nodes of p unless one was reported there
 * already; marks them told. */
static int apply_capacity_untold(coll_numa_ctx_t *ctx, const coll_numa_place_t *p) {
  int untold = ctx->capacity_told == NULL;
  for (int i = 0; i < p->nnodes; i++) {
    int k = apply_node_index(ctx, p->nodes[i]);
    if (k < 0 || ctx->capacity_told == NULL) {
      untold = 1;
      continue;
    }
    untold |= !ctx->capacity_told[k];
    ctx->capacity_told[k] = 1;
  }
  return untold;
}

/* mbind [addr, addr+len) per p; never fails. An MPOL_BIND is kept only while
 * everything this context bound strictly to the node(s), this mapping
 * included, fits with a margin in the free memory seen at setup, and this
 * mapping alone in the memory free now (which already holds the pages of
 * earlier binds that were touched); otherwise MPOL_PREFERRED, said once per
 * node. A preferred (or interleaved) mapping larger than the free memory is
 * not reported: spilling to DDR is what it is for, and reserved parts that are
 * never touched (arenas) cost nothing. */
int coll__numa_place(coll_numa_ctx_t *ctx, void *addr, size_t len, const coll_numa_place_t *p,
                      const char *what, char *notice, size_t notice_len) {
  char nodes[128], line[512];
  line[0] = '\0';
  if (notice != NULL && notice_len > 0)
    notice[0] = '\0';
  if (!ctx->mbind_ok) {
    if (!ctx->mbind_refusal_told) {
      ctx->mbind_refusal_told = 1;
      apply_tell(ctx, notice, notice_len,
                 "mbind is refused here: shared memory stays on the default policy (DDR near the "
                 "CPU that touches it first)");
    }
    return MPOL_DEFAULT;
  }
  apply_nodes_str(p, nodes, sizeof(nodes));
  int mode = p->mode;
  if (mode == MPOL_BIND) {
    uint64_t free0 = 0, free_now = 0, bound = 0;
    int unknown = ctx->bound_bytes == NULL;
    for (int i = 0; i < p->nnodes && !unknown; i++) {
      int k = apply_node_index(ctx, p->nodes[i]);
      uint64_t f0 = k >= 0 ? ctx->topo->nodes[k].free : 0;
      uint64_t fn = coll__numa_node_free_now(p->nodes[i]);
      unknown = f0 == 0 || fn == 0;
      free0 += f0;
      free_now += fn;
      bound += k >= 0 ? ctx->bound_bytes[k] : 0;
    }
    /* bound + len + margin <= free0 and len + margin <= free_now */
    uint64_t budget = free0 < free_now + bound ? free0 : free_now + bound;
    uint64_t margin = free0 / 32 < (64u << 20) ? free0 / 32 : (64u << 20);
    if (unknown) {
      mode = MPOL_PREFERRED;
      if (apply_capacity_untold(ctx, p))
        snprintf(line, sizeof(line),
                 "free memory of node %s unknown: %s of %.1f MiB bound MPOL_PREFERRED instead of "
                 "MPOL_BIND (a strict bind that overflows gets the process OOM-killed)",
                 nodes, what, (double)len / APPLY_MIB);
    } else if (bound + (uint64_t)len + margin > budget) {
      mode = MPOL_PREFERRED;
      char already[96] = "";
      if (bound > 0)
        snprintf(already, sizeof(already), ", %.1f MiB of which this process bound strictly already",
                 (double)bound / APPLY_MIB);
      if (apply_capacity_untold(ctx, p))
        snprintf(line, sizeof(line),
                 "%s of %.1f MiB does not fit in the %.1f MiB free on node %s%s: bound "
                 "MPOL_PREFERRED instead of MPOL_BIND, pages that do not fit go to DDR (not "
                 "repeated for later mappings on node %s)",
                 what, (double)len / APPLY_MIB, (double)budget / APPLY_MIB, nodes, already, nodes);
    }
  }
  unsigned long mask[COLL_NUMA_MASK_LONGS];
  memset(mask, 0, sizeof(mask));
  for (int i = 0; i < p->nnodes; i++)
    if (p->nodes[i] < COLL_NUMA_MASK_LONGS * 64)
      mask[p->nodes[i] / 64] |= 1UL << (p->nodes[i] % 64);
  if (apply_mbind(addr, len, mode, mask, COLL_NUMA_MASK_LONGS * 64 + 1) != 0) {
    int e = errno;
    if (e == EPERM || e == ENOSYS || e == EACCES) {
      ctx->mbind_ok = 0;
      ctx->mbind_refusal_told = 1;
    }
    snprintf(line, sizeof(line),
             "mbind(%s, node %s) failed: %s: %s left on the default policy (DDR near the CPU "
             "that touches it first)",
             apply_mode_name(mode), nodes, strerror(e), what);
    mode = MPOL_DEFAULT;
  }
  if (mode == MPOL_BIND)
    coll__numa_charge(ctx, p, (uint64_t)len, +1);
  if (line[0] != '\0')
    apply_tell(ctx, notice, notice_len, line);
  return mode;
}

static int apply_check_rank(const coll_numa_ctx_t *ctx, int rank) {
  return ctx != NULL && rank >= 0 && rank < ctx->plan->nranks;
}

int coll_numa_place_segment(coll_numa_ctx_t *ctx, void *addr, size_t len, const int *user_ranks,
                            int nusers, char *notice, size_t notice_len, int *mode_p) {
  long page = sysconf(_SC_PAGESIZE);
  if (ctx == NULL || addr == NULL || len == 0 || ((uintptr_t)addr % (uintptr_t)page) != 0 ||
      nusers < 0)
    return -EINVAL;
  for (int u = 0; user_ranks != NULL && u < nusers; u++)
    if (!apply_check_rank(ctx, user_ranks[u]))
      return -EINVAL;
  coll_numa_place_t p;
  int cluster = coll__numa_segment_cluster(ctx->plan, user_ranks, nusers);
  coll__numa_place_for(ctx->topo, ctx->plan, cluster, &p);
  int mode = coll__numa_place(ctx, addr, len, &p, "segment", notice, notice_len);
  if (mode_p != NULL)
    *mode_p = mode;
  return 0;
}

int coll_numa_prefault(void *addr, size_t len) {
  long page = sysconf(_SC_PAGESIZE);
  if (addr == NULL || ((uintptr_t)addr % (uintptr_t)page) != 0)
    return -EINVAL;
  if (len == 0)
    return 0;
  if (madvise(addr, len, MADV_POPULATE_WRITE) == 0)
    return 0;
  if (errno != EINVAL)
    return -errno;
  /* kernel older than 5.14: one write per page, keeping the value */
  volatile unsigned char *b = addr;
  for (size_t off = 0; off < len; off += (size_t)page)
    b[off] = b[off];
  return 0;
}

int coll_numa_bind_segment(coll_numa_ctx_t *ctx, void *addr, size_t len, const int *user_ranks,
                           int nusers, char *notice, size_t notice_len) {
  int rc = coll_numa_place_segment(ctx, addr, len, user_ranks, nusers, notice, notice_len, NULL);
  if (rc != 0)
    return rc;
  return coll_numa_prefault(addr, len);
}

int coll_numa_rank_pu(const coll_numa_ctx_t *ctx, int rank) {
  if (!apply_check_rank(ctx, rank))
    return -EINVAL;
  int pu = ctx->plan->ranks[rank].pu;
  if (ctx->cluster_bound && rank == ctx->local_rank)
    return -ENOENT; /* bound to its cluster, not to one PU */
  return pu < 0 ? -ENOENT : pu;
}

int coll_numa_rank_threads(const coll_numa_ctx_t *ctx, int rank) {
  if (!apply_check_rank(ctx, rank))
    return -EINVAL;
  return ctx->plan->ranks[rank].threads;
}

const char *coll_numa_notice(const coll_numa_ctx_t *ctx) {
  return ctx != NULL ? ctx->notice : "";
}

/* Bind this process per plan; a refusal is a notice, not an error. */
static int apply_cpubind(coll_numa_ctx_t *ctx) {
  const coll_numa_plan_t *plan = ctx->plan;
  const coll_numa_rank_t *rk = &plan->ranks[ctx->local_rank];
  if (plan->policy.bind == COLL_NUMA_BIND_NONE)
    return 0;
  if (!ctx->topo->thissystem || ctx->topo->hwloc == NULL) {
    coll__numa_addnote(ctx->notes, sizeof(ctx->notes),
                       "the topology hwloc loaded is not this machine's (HWLOC_XMLFILE or "
                       "HWLOC_FSROOT set?): not binding");
    return 0;
  }
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  if (set == NULL)
    return -ENOMEM;
  const coll_numa_cluster_t *k = &ctx->topo->clusters[rk->cluster];
  /* The plan's CPU set: the rank's share, core or cluster (the plan widens
   * share and core to the cluster when it has more ranks than PUs, and notes
   * why); cluster_bound makes comm.pu None then. */
  int pus = 0, ranks = 0;
  for (int c = 0; c < k->ncores; c++)
    pus += k->cores[c].npus;
  for (int r = 0; r < plan->nranks; r++)
    ranks += plan->ranks[r].cluster == rk->cluster;
  ctx->cluster_bound = plan->policy.bind != COLL_NUMA_BIND_CLUSTER && ranks > pus;
  for (int i = 0; i < rk->ncpus; i++)
    hwloc_bitmap_set(set, rk->cpus[i]);
  if (hwloc_set_cpubind((hwloc_topology_t)ctx->topo->hwloc, set, HWLOC_CPUBIND_PROCESS) != 0) {
    char pus[128];
    int e = errno;
    hwloc_bitmap_list_snprintf(pus, sizeof(pus), set);
    coll__numa_addnote(ctx->notes, sizeof(ctx->notes), "binding to PUs %s failed: %s: running unbound",
                       pus, strerror(e));
  }
  hwloc_bitmap_free(set);
  return 0;
}

/* One real mbind on a scratch page: containers may refuse it. */
static void apply_probe_mbind(coll_numa_ctx_t *ctx) {
  if (!ctx->topo->thissystem) { /* foreign node numbers mean nothing here */
    ctx->mbind_ok = 0;
    ctx->mbind_refusal_told = 1;
    coll__numa_addnote(ctx->notes, sizeof(ctx->notes),
                       "the topology is not this machine's: memory is not bound either");
    return;
  }
  long page = sysconf(_SC_PAGESIZE);
  void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return;
  const coll_numa_place_t *pl = &ctx->plan->ranks[ctx->local_rank].buf;
  unsigned long mask[COLL_NUMA_MASK_LONGS];
  memset(mask, 0, sizeof(mask));
  for (int i = 0; i < pl->nnodes; i++)
    if (pl->nodes[i] < COLL_NUMA_MASK_LONGS * 64)
      mask[pl->nodes[i] / 64] |= 1UL << (pl->nodes[i] % 64);
  if (apply_mbind(p, (size_t)page, MPOL_PREFERRED, mask, COLL_NUMA_MASK_LONGS * 64 + 1) != 0) {
    int e = errno;
    ctx->mbind_ok = 0;
    ctx->mbind_refusal_told = 1;
    coll__numa_addnote(ctx->notes, sizeof(ctx->notes),
                       "mbind refused (%s; a container without CAP_SYS_NICE?): memory stays on "
                       "the default policy, DDR near each CPU",
                       strerror(e));
  }
  munmap(p, (size_t)page);
}

/* the one-line summary printed once per job */
static void apply_summary(coll_numa_ctx_t *ctx) {
  const coll_numa_plan_t *plan = ctx->plan;
  const coll_numa_place_t *b = &plan->ranks[ctx->local_rank].buf;
  char nodes[128];
  apply_nodes_str(b, nodes, sizeof(nodes));
  if (plan->nhbm == 0)
    snprintf(ctx->notice, sizeof(ctx->notice), "hbmcoll: %s: buffers use DDR (node %s)",
             plan->mode == COLL_NUMA_MODE_CACHE ? "memory mode cache, no HBM node (HBM is a cache)"
                                                : "no HBM on this machine",
             nodes);
  else if (!b->is_hbm)
    snprintf(ctx->notice, sizeof(ctx->notice), "hbmcoll: memory policy ddr: buffers use DDR (node %s)",
             nodes);
  else
    snprintf(ctx->notice, sizeof(ctx->notice), "hbmcoll: buffers in HBM (node %s, %s)", nodes,
             coll_numa_memory_name(plan->effective));
  size_t len = strlen(ctx->notice);
  if (!ctx->topo->thissystem)
    snprintf(ctx->notice + len, sizeof(ctx->notice) - len,
             "; but the topology hwloc loaded is not this machine's, so nothing is bound");
  else if (!ctx->mbind_ok)
    snprintf(ctx->notice + len, sizeof(ctx->notice) - len,
             "; but mbind is refused here, so memory stays on DDR near each CPU");
}

int coll_numa_setup_policy(int local_rank, int local_size, const coll_numa_policy_t *policy,
                           coll_numa_ctx_t **ctx_p) {
  if (local_size < 1 || local_rank < 0 || local_rank >= local_size || ctx_p == NULL)
    return -EINVAL;
  coll_numa_policy_t pol;
  int rc;
  if (policy == NULL) {
    if ((rc = coll_numa_policy_from_env(NULL, NULL, &pol)) != 0)
      return rc;
  } else {
    pol = *policy;
  }
  coll_numa_ctx_t *ctx = calloc(1, sizeof(*ctx));
  if (ctx == NULL)
    return -ENOMEM;
  ctx->local_rank = local_rank;
  ctx->mbind_ok = 1;
  if ((rc = coll_numa_topo_load(NULL, &ctx->topo)) != 0)
    goto out_ctx;
  ctx->bound_bytes = calloc((size_t)ctx->topo->nnodes, sizeof(*ctx->bound_bytes));
  ctx->capacity_told = calloc((size_t)ctx->topo->nnodes, 1);
  if (ctx->bound_bytes == NULL || ctx->capacity_told == NULL) {
    rc = -ENOMEM;
    goto out_ctx;
  }
  if ((rc = coll_numa_plan_make(ctx->topo, local_size, &pol, &ctx->plan)) != 0)
    goto out_ctx;
  snprintf(ctx->notes, sizeof(ctx->notes), "%s", ctx->plan->notes);
  if ((rc = apply_cpubind(ctx)) != 0)
    goto out_ctx;
  apply_probe_mbind(ctx);
  apply_summary(ctx);
  *ctx_p = ctx;
  return 0;

out_ctx:
  coll_numa_free(ctx);
  return rc;
}

int coll_numa_setup(int local_rank, int local_size, coll_numa_ctx_t **ctx_p) {
  return coll_numa_setup_policy(local_rank, local_size, NULL, ctx_p);
}

void coll_numa_free(coll_numa_ctx_t *ctx) {
  if (ctx == NULL)
    return;
  coll_numa_plan_free(ctx->plan);
  coll_numa_topo_free(ctx->topo);
  free(ctx->bound_bytes);
  free(ctx->capacity_told);
  free(ctx);
}
