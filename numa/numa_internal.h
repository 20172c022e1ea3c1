/*
 * internal.h - private structures of numa/ (topology facts, plans, contexts).
 *
 * The topology struct is plain data copied out of hwloc, so that plan.c is a
 * pure function of it and never calls hwloc; the hwloc handle is kept only
 * for binding this machine.
 */
#ifndef COLL_NUMA_INTERNAL_H
#define COLL_NUMA_INTERNAL_H

#include <stdint.h>
#include <stddef.h>

#include "coll_numa.h"

/* Memory modes reported. */
typedef enum {
  COLL_NUMA_MODE_NONE = 0, /* no HBM node and no memory-side cache */
  COLL_NUMA_MODE_FLAT,     /* HBM nodes, no memory-side cache */
  COLL_NUMA_MODE_CACHE,    /* memory-side cache only: HBM is transparent */
  COLL_NUMA_MODE_HYBRID    /* both */
} coll_numa_mode_t;

/* locality of a node for a cluster */
enum { COLL_NUMA_LOC_NONE = 0, COLL_NUMA_LOC_WIDER = 1, COLL_NUMA_LOC_SAME = 2 };

typedef struct {
  unsigned os_index;
  uint64_t size;       /* bytes (hwloc local_memory) */
  uint64_t free;       /* bytes free at discovery (this machine only); 0: unknown */
  uint64_t bandwidth;  /* hwloc Bandwidth memattr from its own locality, MiB/s; 0: unknown */
  char subtype[16];    /* hwloc subtype ("MCDRAM", "HBM", ...) or "" */
  int package;         /* index in the topology's package list, -1 when none */
  int behind_memcache; /* a memory-side cache sits in front of it */
  char cpus[64];       /* its locality as a list ("0-15"), for the report */
  unsigned char *loc;  /* [nclusters] COLL_NUMA_LOC_* */
} coll_numa_node_t;

typedef struct {
  int npus;
  unsigned *pus; /* OS indices, hwloc logical order */
  int tile;      /* first PU of the L2 that holds it (a KNL tile: two cores), -1 none */
} coll_numa_core_t;

typedef struct {
  int package;             /* -1 when none */
  int ncores;
  coll_numa_core_t *cores; /* logical order */
} coll_numa_cluster_t;

struct coll_numa_topo {
  char source[256];        /* "this machine" or the path */
  int thissystem;          /* 1: loaded from this machine and bindable */
  char memory_mode[32];    /* hwloc info MemoryMode ("" absent) */
  char cluster_mode[32];   /* hwloc info ClusterMode ("" absent) */
  int nmemcaches;          /* memory-side caches (MemCache, or L3 subtype MemorySideCache; when
                            * hwloc has none: sysfs nodeN/memory_side_cache/indexM entries) */
  uint64_t memcache_bytes; /* their total size */
  int memcache_sysfs;      /* 1: the caches were found in sysfs, hwloc showed none */
  int npackages;
  int nnodes;
  coll_numa_node_t *nodes; /* sorted by os_index */
  int nclusters;
  coll_numa_cluster_t *clusters;
  char note[384]; /* one line (no newline) about how the facts were read, or "" */
  void *hwloc; /* hwloc_topology_t, for binding (NULL when not loaded from here) */
};

/* A placement decision for one buffer. */
typedef struct {
  int mode;       /* MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE */
  int cluster;    /* cluster it is for */
  int nnodes;
  unsigned nodes[64]; /* OS indices */
  int is_hbm;     /* the node(s) are HBM */
} coll_numa_place_t;

typedef struct {
  int cluster; /* index in topo->clusters */
  int core;    /* index in that cluster's cores */
  int ncpus;   /* its CPU set: PU OS indices, sorted (0 with bind none) */
  unsigned *cpus;
  int threads; /* compute threads it should run: the cores of its set (>= 1) */
  int pu;      /* OS index, -1 with bind none */
  coll_numa_place_t buf;
} coll_numa_rank_t;

#define COLL_NUMA_NOTES_MAX 1024

struct coll_numa_plan {
  coll_numa_policy_t policy;
  coll_numa_memory_t effective; /* policy after auto and fallbacks */
  coll_numa_mode_t mode;
  int nhbm;
  unsigned *hbm;      /* OS indices, sorted */
  char *is_hbm;       /* [topo->nnodes] */
  int *cl_hbm;        /* [nclusters] node index of its HBM node, -1 */
  int *cl_ddr;        /* [nclusters] node index of its DDR node, -1 */
  int nranks;
  coll_numa_rank_t *ranks;
  char notes[COLL_NUMA_NOTES_MAX]; /* lines ending in '\n' */
};

struct coll_numa_ctx {
  coll_numa_topo_t *topo;
  coll_numa_plan_t *plan;
  int local_rank;
  int mbind_ok;          /* 0 once mbind was refused */
  int cluster_bound;     /* bind core, but more ranks than PUs: bound to the cluster */
  int mbind_refusal_told;
  /* hbm_bind capacity, per node (index as topo->nodes; the budget is the
   * node's free memory seen at setup, topo->nodes[i].free): bytes this
   * context has put under MPOL_BIND so far (touched or not; scratch buffers
   * are taken off when freed, shared segments stay counted, as this layer is
   * not told when they are unmapped), and whether a capacity fallback on the
   * node was reported already (said once per node) */
  uint64_t *bound_bytes;
  unsigned char *capacity_told;
  int scratch_way_;      /* scratch.c: 0 not chosen yet, 1 memkind, 2 mmap + mbind, 3 mmap */
  void *scratch_kind_;   /* with 1: the memkind_t */
  char notice[512];
  char notes[COLL_NUMA_NOTES_MAX]; /* every fallback so far, lines */
};

/* plan.c */
int coll__numa_place_for(const coll_numa_topo_t *topo, const coll_numa_plan_t *plan, int cluster,
                         coll_numa_place_t *place_p);
int coll__numa_segment_cluster(const coll_numa_plan_t *plan, const int *user_ranks, int nusers);
const char *coll__numa_mode_name(coll_numa_mode_t mode);
/* Policy from the words (or the environment), topology from path (NULL: this machine), plan
 * for nranks (<= 0: one per core): 0 and both, or an error of any of the three and neither. */
int coll__numa_plan_for(const char *topology_path, int nranks, const char *memory_policy,
                        const char *bind_policy, coll_numa_topo_t **topo_p,
                        coll_numa_plan_t **plan_p);
void coll__numa_addnote(char *notes, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* report.c: growable string */
typedef struct {
  char *buf;
  size_t len, cap;
  int oom;
} coll_numa_str_t;
void coll__numa_str_add(coll_numa_str_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* apply.c: put `len` bytes at addr under placement p (what: "segment", ...; a fallback
 * is said in notice and the notes); the MPOL_* mode used. coll__numa_charge: count
 * (sign +1) or release (-1) bytes strictly bound to p's nodes for hbm_bind. */
int coll__numa_place(coll_numa_ctx_t *ctx, void *addr, size_t len, const coll_numa_place_t *p,
                     const char *what, char *notice, size_t notice_len);
void coll__numa_charge(coll_numa_ctx_t *ctx, const coll_numa_place_t *p, uint64_t len, int sign);
#define COLL_NUMA_MASK_LONGS 16 /* node OS indices up to 1023 */

/* discover.c */
uint64_t coll__numa_node_free_now(unsigned os_index); /* from /sys, 0: unknown */

/* cpuset.c: fill every rank's cpus/ncpus/threads; cnt[c] ranks were dealt to
 * cluster c, numbered from first[c]. 0 or -ENOMEM. */
int coll__numa_plan_cpusets(const coll_numa_topo_t *topo, coll_numa_plan_t *plan, const int *cnt,
                            const int *first);

#endif /* COLL_NUMA_INTERNAL_H */
