/*
 * coll_numa.h - topology and placement layer of hbmcoll (numa/).
 *
 * Three steps, kept apart:
 *   1. discover  (hwloc)  coll_numa_topo_load(): NUMA nodes, sizes, free
 *      memory, KNL ClusterMode/MemoryMode, memory-side caches (hwloc's; when
 *      it shows none, sysfs nodeN/memory_side_cache, which hwloc 2.9's KNL
 *      quirk ignores), bandwidth memory attributes, clusters (SNC domains /
 *      packages).  Facts only.
 *   2. plan      (pure)   coll_numa_plan_make(): which PU each local rank
 *      runs on, which NUMA node(s) hold its buffers and each shared segment.
 *      A pure function of (topology facts, number of local ranks, policy).
 *   3. apply              coll_numa_setup() / coll_numa_bind_segment() /
 *      coll_numa_scratch_alloc(): hwloc cpubind, mbind + pre-fault, memkind.
 *
 * Conventions: every int function returns 0 or a negative errno code (no
 * foreign code leaves this layer: hwloc's -1+errno and memkind's own codes
 * are translated here); output parameters end in _p, come last and are
 * written only on success; nothing here prints: human-readable text comes
 * back as a string (report, notice).
 *
 * HBM detection (in the plan, in this order): a user list (HBMCOLL_HBM_NODES,
 * else MEMKIND_HBW_NODES) replaces detection; otherwise a node is HBM when its
 * hwloc subtype is "MCDRAM" or "HBM", or when its hwloc Bandwidth memory
 * attribute is >= 2x the bandwidth of the other (DDR) node(s) of the same
 * locality.
 *
 * Policies (HBMCOLL_MEMORY / --memory):
 *   auto           (default) hbm_preferred when there is an HBM node, else DDR
 *   hbm_bind       MPOL_BIND to the HBM node while the mapping, added to all
 *                  this context bound strictly to that node before, fits in the
 *                  node's free memory (as seen at setup, with a margin), else
 *                  MPOL_PREFERRED (an over-full MPOL_BIND gets the process
 *                  OOM-killed), with a notice (once per node)
 *   hbm_preferred  MPOL_PREFERRED to the HBM node (spills to DDR when full;
 *                  no notice: that is what it is for)
 *   hbm_interleave MPOL_INTERLEAVE over every HBM node of the machine
 *   ddr            MPOL_PREFERRED to the DDR node of the cluster
 * Binding (HBMCOLL_BIND / --bind): share (default: the rank's share of its
 * cluster's cores, all of them when it is alone there, so a rank's compute
 * threads keep their cores), core (one core per rank), cluster (every PU of
 * the rank's cluster), none. With more ranks in a cluster than PUs, share and
 * core bind to the whole cluster (several ranks pinned to one PU would make
 * every wait cost a time slice).
 */
#ifndef COLL_NUMA_H
#define COLL_NUMA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct coll_numa_topo coll_numa_topo_t; /* discovered facts (opaque) */
typedef struct coll_numa_plan coll_numa_plan_t; /* a placement plan (opaque) */
typedef struct coll_numa_ctx coll_numa_ctx_t;   /* this process: topo + plan + state */

typedef enum {
  COLL_NUMA_MEM_AUTO = 0,
  COLL_NUMA_MEM_HBM_BIND,
  COLL_NUMA_MEM_HBM_PREFERRED,
  COLL_NUMA_MEM_HBM_INTERLEAVE,
  COLL_NUMA_MEM_DDR
} coll_numa_memory_t;

typedef enum {
  COLL_NUMA_BIND_CORE = 0,
  COLL_NUMA_BIND_CLUSTER,
  COLL_NUMA_BIND_NONE,
  COLL_NUMA_BIND_SHARE
} coll_numa_bind_t;

#define COLL_NUMA_NODES_MAX 256  /* longest node list accepted, e.g. "4-7,12" */
#define COLL_NUMA_RANKS_MAX 65536 /* most local ranks a plan takes */

typedef struct {
  coll_numa_memory_t memory;
  coll_numa_bind_t bind;
  char hbm_nodes[COLL_NUMA_NODES_MAX]; /* user's HBM node list ("" = detect) */
  const char *hbm_nodes_from;          /* static string: variable or option it came from, or NULL */
} coll_numa_policy_t;

/* ---- policy ------------------------------------------------------------- */

/* Build a policy from strings. memory: "auto", "hbm_bind", "hbm_preferred",
 * "hbm_interleave", "ddr" ("hbm" is accepted for hbm_preferred); bind:
 * "share", "core", "cluster" ("quadrant" is accepted for cluster), "none"; NULL or ""
 * picks the default. hbm_nodes: list in hwloc/numactl syntax ("4-7,9") or
 * NULL/"" for detection; it is checked against a topology only when a plan is
 * made. Returns 0 and *policy_p, or -EINVAL for an unknown word or a list
 * that is not a node list (or longer than COLL_NUMA_NODES_MAX - 1 chars). */
int coll_numa_policy_parse(const char *memory, const char *bind, const char *hbm_nodes,
                           coll_numa_policy_t *policy_p);

/* As coll_numa_policy_parse() with HBMCOLL_MEMORY, HBMCOLL_BIND and
 * HBMCOLL_HBM_NODES (else MEMKIND_HBW_NODES) from the environment; a non-NULL
 * memory/bind argument overrides its variable. Returns 0 and *policy_p, or
 * -EINVAL naming nothing (the caller reports which variable is wrong by
 * calling coll_numa_policy_parse() on it if needed). */
int coll_numa_policy_from_env(const char *memory, const char *bind, coll_numa_policy_t *policy_p);

/* The i-th word (0, 1, ...) the parser takes for the memory policy (bind 0) or the
 * binding (bind 1), aliases included, NULL past the last: the one list the launcher's and
 * the topo CLI's choices come from. A static string. */
const char *coll_numa_policy_word(int bind, int i);

/* The policy word of a value ("hbm_bind", "share", ...), as the parser takes it; a static
 * string, "?" for a value out of range. */
const char *coll_numa_memory_name(coll_numa_memory_t memory);
const char *coll_numa_bind_name(coll_numa_bind_t bind);

/* ---- 1. discover -------------------------------------------------------- */

/* Load a topology. path NULL: this machine (binding possible); otherwise an
 * hwloc XML file or a directory laid out like / (sys, proc) used as
 * HWLOC_FSROOT; the sysfs memory_side_cache entries are read under that
 * directory (path NULL: under / or the user's HWLOC_FSROOT; an XML file: not
 * at all). A foreign topology is never bound to. For a directory the
 * HWLOC_FSROOT/HWLOC_COMPONENTS variables are set only while hwloc loads and
 * restored after (not thread-safe against other environment users; memkind
 * is never called here). Returns 0 and *topo_p; -ENOENT (no such path),
 * -EINVAL (hwloc cannot parse it, or it has no PU or no NUMA node), -ENOMEM,
 * or another -errno from hwloc. */
int coll_numa_topo_load(const char *path, coll_numa_topo_t **topo_p);
void coll_numa_topo_free(coll_numa_topo_t *topo); /* NULL is fine */

/* Number of cores (PUs where hwloc has no cores) usable in the topology, >= 1 for any
 * topology coll_numa_topo_load returned. */
int coll_numa_topo_ncores(const coll_numa_topo_t *topo);

/* ---- 2. plan (pure) ----------------------------------------------------- */

/* Plan nranks local ranks on topo under policy. Ranks are spread evenly over
 * packages then clusters, one per core while cores are free (then a second
 * hardware thread of each core, and so on), numbered in blocks cluster by
 * cluster. Reads nothing but its arguments. Returns 0 and *plan_p, -EINVAL
 * (nranks < 1 or > COLL_NUMA_RANKS_MAX, a policy node list naming no node of topo), or
 * -ENOMEM. Notes about the choice (no HBM, unknown nodes in the list, a
 * policy that cannot be honoured) are kept in the plan for the report. */
int coll_numa_plan_make(const coll_numa_topo_t *topo, int nranks, const coll_numa_policy_t *policy,
                        coll_numa_plan_t **plan_p);
void coll_numa_plan_free(coll_numa_plan_t *plan); /* NULL is fine */

/* Render topo + plan: json != 0 gives one JSON object
 *   {"memory_mode": "flat|cache|hybrid|none", "cluster_mode": str|null,
 *    "hbm_nodes": [os...], "ranks": [{"rank": i, "pu": os|null,
 *    "buffer_nodes": [os...]}, ...]}
 * followed by a newline ("pu" is null with bind none); json == 0 gives a
 * human report. Returns 0 and *text_p (malloc'ed, caller frees), or -ENOMEM. */
int coll_numa_plan_render(const coll_numa_topo_t *topo, const coll_numa_plan_t *plan, int json,
                          char **text_p);

/* discover + plan + render, applying nothing: what `python -m hbmcoll.topo`
 * and build/coll-topo print. topology_path NULL: this machine. nranks <= 0:
 * one rank per core. memory_policy/bind_policy NULL: from HBMCOLL_MEMORY /
 * HBMCOLL_BIND (defaults auto/core); the HBM list always comes from
 * HBMCOLL_HBM_NODES or MEMKIND_HBW_NODES. Returns 0 and *text_p (malloc'ed),
 * or the code of coll_numa_policy_parse(), coll_numa_topo_load(),
 * coll_numa_plan_make(); on failure *text_p is untouched. */
int coll_numa_report(const char *topology_path, int nranks, const char *memory_policy,
                     const char *bind_policy, int json, char **text_p);

/* The tree hbmcoll's small collectives would run on for that plan (libcoll's
 * coll_tree_build fed each rank's first PU and L2 tile): per rank its PU, tile,
 * level, parent and children, and the PUs it waits on. json as above: {"fanout",
 * "depth", "ranks": [{"rank", "pu", "tile", "level", "parent", "parent_pu",
 * "children_pus": [...]}]} (-1 where there is none). Returns as coll_numa_report. */
int coll_numa_tree_report(const char *topology_path, int nranks, const char *memory_policy,
                          const char *bind_policy, int json, char **text_p);

/* ---- 3. apply (this machine) -------------------------------------------- */

/* For local rank local_rank of local_size: discover this machine, plan with
 * the policy from the environment, bind this process (HBMCOLL_BIND), and probe
 * one real mbind (containers without CAP_SYS_NICE refuse it: the context then
 * keeps DDR and says so in its notice). Call once at communicator creation,
 * never on a hot path. A refused cpubind is not an error either (notice).
 * Returns 0 and *ctx_p; -EINVAL (local_rank out of [0, local_size), a bad
 * HBMCOLL_MEMORY/HBMCOLL_BIND/HBMCOLL_HBM_NODES), -ENOMEM, or an -errno
 * from hwloc when this machine's topology cannot be loaded. */
int coll_numa_setup(int local_rank, int local_size, coll_numa_ctx_t **ctx_p);

/* As coll_numa_setup() with an explicit policy (NULL: from the environment). */
int coll_numa_setup_policy(int local_rank, int local_size, const coll_numa_policy_t *policy,
                           coll_numa_ctx_t **ctx_p);

/* The setup notice: one line (no newline) saying what memory is used and any
 * fallback taken at setup ("no HBM node on this machine: buffers use DDR
 * (node 0)", "mbind refused: ..."), or "" when there is nothing to say.
 * Meant to be printed once per job by local rank 0. Valid until free. */
const char *coll_numa_notice(const coll_numa_ctx_t *ctx);

/* OS index of the PU planned for local rank `rank` (the first of its CPU
 * set), -EINVAL when rank is out of range, -ENOENT with bind none. */
int coll_numa_rank_pu(const coll_numa_ctx_t *ctx, int rank);

/* Compute threads the plan gives local rank `rank`: the cores of its CPU set
 * (its share of the cluster with bind share; 1 with core; the cluster's cores
 * over its ranks with cluster; the machine's over all ranks with none), at
 * least 1; -EINVAL when rank is out of range. */
int coll_numa_rank_threads(const coll_numa_ctx_t *ctx, int rank);

/* Place a fresh shared mapping [addr, addr+len) used by the local ranks
 * user_ranks[0..nusers) (NULL/0: every rank): mbind it, before anything
 * touches it, to the node(s) the plan gives for the cluster with the most
 * users. An MPOL_BIND is checked against the node's capacity in total, not
 * mapping by mapping: the context keeps a running count per node of the bytes
 * it bound strictly so far (touched or not; a mapping's pages count from the
 * moment it is bound, and stay counted after it is unmapped, as this layer is
 * not told), and binds strictly only while count + len + a margin (1/32 of
 * the free memory, at most 64 MiB) fits in the node's free memory seen at
 * setup, and len + margin in the memory free now; otherwise MPOL_PREFERRED.
 * Does not touch the pages. When mbind is refused or fails, or the policy had
 * to be weakened, the mapping keeps the default policy (DDR near the faulting
 * CPU) or the weaker one, and one line (no newline) is written to notice (if
 * notice_len > 0; "" when nothing happened; a refusal, or a capacity fallback
 * on the same node, already reported by this ctx is not repeated). Not
 * thread-safe on one ctx (call it from the thread that creates communicators).
 * Returns 0 (also after such a fallback), or -EINVAL (addr not page
 * aligned, len == 0, a user rank out of range).
 * For the policy put in place, *mode_p (if not NULL) gets the MPOL_* mode
 * (MPOL_DEFAULT when nothing was bound). */
int coll_numa_place_segment(coll_numa_ctx_t *ctx, void *addr, size_t len, const int *user_ranks,
                            int nusers, char *notice, size_t notice_len, int *mode_p);

/* Pre-fault [addr, addr+len) for writing: MADV_POPULATE_WRITE, or one write
 * per page where the kernel lacks it (the write keeps the byte's value).
 * Returns 0, -EINVAL (addr not page aligned), -ENOMEM / -EFAULT from the
 * kernel. */
int coll_numa_prefault(void *addr, size_t len);

/* coll_numa_place_segment() then coll_numa_prefault(): the call for a new
 * shared segment. Same returns (a failed pre-fault returns its code). */
int coll_numa_bind_segment(coll_numa_ctx_t *ctx, void *addr, size_t len, const int *user_ranks,
                           int nusers, char *notice, size_t notice_len);

/* Private scratch buffer for this rank (not for sharing between processes),
 * 64-byte aligned, on the plan's node for this rank: through memkind
 * (MEMKIND_HBW_PREFERRED, or MEMKIND_HBW_INTERLEAVE; never a strict bind, as
 * an overflow would be an OOM kill; MEMKIND_DEFAULT for DDR) when memkind
 * sees HBW memory, else an anonymous mapping mbind-ed like a segment (e.g.
 * HBM named by HBMCOLL_HBM_NODES only; with hbm_bind such a buffer counts in
 * the node's strict total until coll_numa_scratch_free()). memkind picks its
 * node from the CPU the caller runs on: setup has pinned this process already.
 * size 0 gives -EINVAL. Returns 0 and *ptr_p, -ENOMEM. */
int coll_numa_scratch_alloc(coll_numa_ctx_t *ctx, size_t size, void **ptr_p);
/* Free a scratch buffer with the size it was allocated with (NULL is fine). */
void coll_numa_scratch_free(coll_numa_ctx_t *ctx, void *ptr, size_t size);

/* A memory server's pool (hbmcoll-memserver): a scratch buffer (above) of size bytes, zeroed,
 * so every page is placed before a client writes and a new buffer reads as zeros. *node_p: the
 * node most of its pages landed on (coll_numa_pages_node). Free it with coll_numa_scratch_free. */
int coll_numa_pool_alloc(coll_numa_ctx_t *ctx, size_t size, void **ptr_p, int *node_p);

/* The node most of [addr, addr+len)'s pages sit on (move_pages(2) on up to 64 pages spread
 * over it), or -1 when the kernel cannot say. */
int coll_numa_pages_node(const void *addr, size_t len);

/* Report of this context (as coll_numa_plan_render(), plus "notices": [..]
 * in JSON and a notices section in text): what hbmcoll.topology() shows.
 * Returns 0 and *text_p (malloc'ed), or -ENOMEM. */
int coll_numa_ctx_report(const coll_numa_ctx_t *ctx, int json, char **text_p);

void coll_numa_free(coll_numa_ctx_t *ctx); /* NULL is fine */

#ifdef __cplusplus
}
#endif
#endif /* COLL_NUMA_H */
