/*
 * knl_check.c - runs inside an emulated KNL / Xeon Max guest (tests/emulation/run.sh):
 * a multi-rank allreduce with libcoll + numa/, then asserts with move_pages(2)
 * that the shared segment's pages sit where the placement layer promised.
 *
 *   knl_check [--mode MODE] [-n RANKS]
 *
 * MODE (snc4-flat, quad-flat, cache, hmat-flat, snc4-hybrid) adds the layout
 * facts the harness built the guest with (e.g. snc4-flat: HBM of cluster i is
 * node 4+i); without it only what sysfs says is checked. RANKS defaults to the
 * number of online CPUs.
 *
 * Every rank (a forked process) does what a Python rank does through pymod:
 * coll_numa_setup() (pins per HBMCOLL_BIND), coll_comm_create() with
 * coll_numa_place_segment() as the place callback, then collectives. The
 * expected node of every buffer is computed independently from sysfs (HBM node
 * of a cluster = the nearest memory-only node by SLIT distance; none: the
 * cluster's own DDR node) and compared with the plan (coll_numa_ctx_report)
 * and with the kernel (move_pages, status mode), as is a memory server's pool.
 * Prints one PASS/FAIL line per check and a final "N passed, N failed" line (also
 * appended as "N N" to the file KNL_CHECK_TALLY names); exit status 1 on any failure.
 * Honours HBMCOLL_BIND (core, cluster, none) and HBMCOLL_MEMORY (ddr, hbm_bind:
 * then every placement must be a strict MPOL_BIND when the arena is small).
 * Self-test of the harness: KNL_CHECK_STALL=R makes rank R hang before the final
 * barrier (its peers must time out, R is killed at KNL_CHECK_DEADLINE seconds).
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <linux/mempolicy.h> /* MPOL_DEFAULT */

#include "coll.h"
#include "coll_numa.h"
#include "coll_internal.h" /* libcoll/src: segment layout (base, ctl_off, arena_off) for the page checks */

#define MAXNODES 64
#define MAXCPUS 1024
#define RANK_DEADLINE_S 240 /* default of KNL_CHECK_DEADLINE: a rank still running after this
                              * many seconds is killed (SIGALRM) and fails */

/* ---- results shared by all ranks ---------------------------------------- */
static struct shared {
  _Atomic int passed, failed;
} *g_res;
static int g_rank = -1;
static const char *g_mode = "";

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  ssize_t w = write(1, line, (size_t)n); /* one write per line: ranks do not interleave */
  (void)w;
}

static int check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int check(int ok, const char *fmt, ...) {
  char what[900];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  atomic_fetch_add(ok ? &g_res->passed : &g_res->failed, 1);
  if (g_rank >= 0)
    out("%s [%s] rank %d: %s", ok ? "PASS" : "FAIL", g_mode, g_rank, what);
  else
    out("%s [%s] %s", ok ? "PASS" : "FAIL", g_mode, what);
  return ok;
}

/* ---- sysfs facts (independent of hwloc and of the plan) ----------------- */
typedef struct {
  int present;
  cpu_set_t cpus;
  int ncpus;
  long mem_kb;
  int dist[MAXNODES];
} node_t;

static node_t g_node[MAXNODES];
static int g_cluster_node[MAXNODES]; /* cluster index -> node with CPUs, in node order */
static int g_ncl;

static int read_file(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(buf, 1, cap - 1, f);
  fclose(f);
  buf[n] = '\0';
  return 0;
}

static void parse_cpulist(const char *s, cpu_set_t *set, int *n_p) {
  CPU_ZERO(set);
  int n = 0;
  while (*s && *s != '\n') {
    char *end;
    long a = strtol(s, &end, 10), b = a;
    if (end == s) break;
    s = end;
    if (*s == '-') b = strtol(s + 1, (char **)&s, 10);
    for (long c = a; c <= b && c < MAXCPUS; c++) CPU_SET((int)c, set), n++;
    if (*s == ',') s++;
  }
  *n_p = n;
}

static void sysfs_load(void) {
  char path[128], buf[4096];
  for (int i = 0; i < MAXNODES; i++) {
    node_t *nd = &g_node[i];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", i);
    if (read_file(path, buf, sizeof buf) != 0) continue;
    nd->present = 1;
    parse_cpulist(buf, &nd->cpus, &nd->ncpus);
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/meminfo", i);
    if (read_file(path, buf, sizeof buf) == 0) {
      const char *p = strstr(buf, "MemTotal:");
      if (p) nd->mem_kb = strtol(p + 9, NULL, 10);
    }
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/distance", i);
    if (read_file(path, buf, sizeof buf) == 0) {
      char *s = buf;
      for (int j = 0; j < MAXNODES; j++) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        nd->dist[j] = (int)v;
        s = end;
      }
    }
  }
  g_ncl = 0;
  for (int i = 0; i < MAXNODES; i++)
    if (g_node[i].present && g_node[i].ncpus > 0) g_cluster_node[g_ncl++] = i;
}

/* Nearest memory-only node of a CPU node (ties: lowest), or -1. */
static int sysfs_hbm_of(int node) {
  int best = -1;
  for (int j = 0; j < MAXNODES; j++) {
    if (!g_node[j].present || g_node[j].ncpus > 0 || g_node[j].mem_kb <= 0) continue;
    if (best < 0 || g_node[node].dist[j] < g_node[node].dist[best]) best = j;
  }
  return best;
}

/* Cluster (index in g_cluster_node) whose CPUs hold every CPU of set, or -1. */
static int cluster_of_set(const cpu_set_t *set) {
  if (CPU_COUNT(set) == 0) return -1;
  for (int c = 0; c < g_ncl; c++) {
    cpu_set_t x;
    CPU_AND(&x, set, &g_node[g_cluster_node[c]].cpus);
    if (CPU_EQUAL(&x, set)) return c;
  }
  return -1;
}

static int cluster_of_cpu(int cpu) {
  for (int c = 0; c < g_ncl; c++)
    if (CPU_ISSET(cpu, &g_node[g_cluster_node[c]].cpus)) return c;
  return -1;
}

/* The plan's promise, restated: ranks dealt evenly over clusters (all have the
 * same number of cores here) and numbered in blocks cluster by cluster. */
static int expected_cluster(int rank, int nranks) {
  int first = 0;
  for (int c = 0; c < g_ncl; c++) {
    int cnt = nranks / g_ncl + (c < nranks % g_ncl);
    if (rank < first + cnt) return c;
    first += cnt;
  }
  return g_ncl - 1;
}

/* ---- what the harness built (per mode) ---------------------------------- */
typedef struct {
  const char *name;
  int nclusters;
  int hbm_base; /* HBM node of cluster i = hbm_base + i; -1: no HBM (DDR node of the cluster) */
  const char *memory_mode; /* what the plan must call it: "flat", "cache", "hybrid" or "a|b" */
} knl_mode_t;

static const knl_mode_t g_modes[] = {
    {"snc4-flat", 4, 4, "flat"},    {"hmat-flat", 4, 4, "flat"}, {"snc4-hybrid", 4, 4, "hybrid"},
    {"quad-flat", 1, 1, "flat"},    {"cache", 1, -1, "cache"},
};

/* ---- the page checker ----------------------------------------------------- */
/* Node of every page of [addr, addr+len) by move_pages(2) in status mode.
 * Returns pages on `want`; *other_p: first other node or status seen. */
static long pages_on(void *addr, size_t len, int want, long *npages_p, int *other_p, long *nother_p) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)addr & ~((uintptr_t)page - 1);
  long n = (long)(((uintptr_t)addr + len - a + (uintptr_t)page - 1) / (uintptr_t)page);
  void **pages = malloc((size_t)n * sizeof *pages);
  int *status = malloc((size_t)n * sizeof *status);
  long on = 0, other = 0;
  *other_p = 0;
  if (pages == NULL || status == NULL) {
    free(pages);
    free(status);
    *npages_p = n;
    *other_p = -ENOMEM;
    *nother_p = n;
    return 0;
  }
  for (long i = 0; i < n; i++) pages[i] = (void *)(a + (uintptr_t)i * (uintptr_t)page);
  if (syscall(SYS_move_pages, 0, (unsigned long)n, pages, NULL, status, 0) != 0) {
    int e = -errno;
    for (long i = 0; i < n; i++) status[i] = e;
  }
  for (long i = 0; i < n; i++) {
    if (status[i] == want) {
      on++;
    } else {
      if (other++ == 0) *other_p = status[i];
    }
  }
  free(pages);
  free(status);
  *npages_p = n;
  *nother_p = other;
  return on;
}

static void check_pages(const char *what, void *addr, size_t len, int want) {
  long n, nother;
  int other;
  long on = pages_on(addr, len, want, &n, &other, &nother);
  if (on == n)
    check(1, "%s: %ld/%ld pages on node %d", what, on, n, want);
  else
    check(0, "%s: %ld/%ld pages on node %d; %ld elsewhere (first: %s %d)", what, on, n, want, nother,
          other < 0 ? "error" : "node", other < 0 ? -other : other);
}

/* ---- place callback: what pymod passes, with a record of what happened --- */
static struct {
  int calls, failed, unbound, strict;
  char notice[256];
} g_place;

static int place_cb(void *arg, void *addr, size_t len, const int *local_ranks, int n) {
  char notice[256] = "";
  int mode = -1;
  int rc = coll_numa_place_segment(arg, addr, len, local_ranks, n, notice, sizeof notice, &mode);
  g_place.calls++;
  if (rc != 0) g_place.failed++;
  if (mode == MPOL_DEFAULT) g_place.unbound++;
  if (mode == MPOL_BIND) g_place.strict++;
  if (notice[0] && !g_place.notice[0]) snprintf(g_place.notice, sizeof g_place.notice, "%s", notice);
  return rc;
}

/* ---- allreduce ------------------------------------------------------------ */
static float value(int rank, size_t i) { return (float)((i * 7 + (size_t)rank * 13) % 61); }

static int allreduce_once(coll_comm_t *comm, float *send, float *recv, size_t count, int P, int me,
                          char *err, size_t errlen) {
  for (size_t i = 0; i < count; i++) send[i] = value(me, i);
  for (size_t i = 0; i < count; i++) recv[i] = -1.0f;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = count,
                   .send = send, .recv = recv};
  int rc = coll_run(comm, &a);
  if (rc) {
    const char *text = "";
    coll_comm_error(comm, &text);
    snprintf(err, errlen, "count %zu: coll_run: %s (%s)", count, coll_strerror(rc), text);
    return rc;
  }
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < P; r++) want += value(r, i);
    if (recv[i] != want) {
      snprintf(err, errlen, "count %zu: element %zu is %g, want %g", count, i, (double)recv[i],
               (double)want);
      return -1;
    }
  }
  return 0;
}

/* ---- one rank ------------------------------------------------------------- */
static int json_rank(const char *json, int rank, int *pu_p, int *node_p) {
  char key[48];
  snprintf(key, sizeof key, "{\"rank\": %d,", rank);
  const char *p = strstr(json, key);
  if (p == NULL) return -1;
  const char *q = strstr(p, "\"pu\": ");
  const char *b = strstr(p, "\"buffer_nodes\": [");
  if (q == NULL || b == NULL) return -1;
  *pu_p = strncmp(q + 6, "null", 4) == 0 ? -1 : atoi(q + 6);
  *node_p = atoi(b + 17);
  return 0;
}

static int run_rank(int me, int P, const knl_mode_t *m, const char *job_key) {
  g_rank = me;
  const char *dl = getenv("KNL_CHECK_DEADLINE");
  alarm(dl && atoi(dl) > 0 ? (unsigned)atoi(dl) : RANK_DEADLINE_S);
  const char *bind = getenv("HBMCOLL_BIND");
  const char *memory = getenv("HBMCOLL_MEMORY");
  int bind_core = bind == NULL || *bind == '\0' || strcmp(bind, "core") == 0;
  int bind_cluster = bind != NULL && (strcmp(bind, "cluster") == 0 || strcmp(bind, "quadrant") == 0);
  int bind_none = bind != NULL && strcmp(bind, "none") == 0;
  int want_ddr = memory != NULL && strcmp(memory, "ddr") == 0;
  int want_strict = memory != NULL && strcmp(memory, "hbm_bind") == 0;

  coll_numa_ctx_t *ctx = NULL;
  int rc = coll_numa_setup(me, P, &ctx);
  if (!check(rc == 0, "coll_numa_setup(%d, %d): %s", me, P, rc ? strerror(-rc) : "ok")) return 1;
  const char *notice = coll_numa_notice(ctx);
  char *report = NULL;
  if (coll_numa_ctx_report(ctx, 1, &report) != 0) report = NULL;
  if (me == 0) {
    out("NOTICE [%s] %s", g_mode, notice);
    char *copy = report ? strdup(report) : NULL, *sv = NULL;
    for (char *l = copy ? strtok_r(copy, "\n", &sv) : NULL; l; l = strtok_r(NULL, "\n", &sv))
      out("PLAN [%s] %s", g_mode, l); /* the plan as JSON */
    free(copy);
  }

  /* where this rank must be and where its memory must go (sysfs only) */
  int cl_want = expected_cluster(me, P);
  int cl_node = g_cluster_node[cl_want];
  int hbm = sysfs_hbm_of(cl_node);
  int mem_want = (hbm < 0 || want_ddr) ? cl_node : hbm;
  if (m) {
    int mode_node = m->hbm_base < 0 || want_ddr ? cl_want : m->hbm_base + cl_want;
    check(g_ncl == m->nclusters && mode_node == mem_want,
          "guest layout as built for %s: %d clusters (want %d), memory node for cluster %d: sysfs %d, "
          "mode %d",
          m->name, g_ncl, m->nclusters, cl_want, mem_want, mode_node);
  }

  /* the plan agrees */
  int plan_pu = -2, plan_node = -2;
  if (report == NULL || json_rank(report, me, &plan_pu, &plan_node) != 0) {
    check(0, "coll_numa_ctx_report: no entry for this rank");
  } else {
    check(plan_node == mem_want, "plan puts this rank's buffers on node %d (want %d)", plan_node,
          mem_want);
    if (!bind_none)
      check(plan_pu >= 0 && cluster_of_cpu(plan_pu) == cl_want, "plan pins it to PU %d in cluster %d "
            "(node %d; want cluster %d)", plan_pu, plan_pu >= 0 ? cluster_of_cpu(plan_pu) : -1,
            plan_pu >= 0 && cluster_of_cpu(plan_pu) >= 0 ? g_cluster_node[cluster_of_cpu(plan_pu)] : -1,
            cl_want);
  }
  if (m && me == 0 && report) {
    /* snc4-hybrid: hwloc 2.9's KNL quirk says MemoryMode=Flat and hides the memory-side
     * caches the kernel shows (it wants the SMBIOS dump); numa/ reads them from sysfs
     * (nodeN/memory_side_cache), so the plan must say "hybrid" */
    const char *said = strstr(report, "\"memory_mode\": \"");
    char got[16] = "?";
    if (said) sscanf(said + 16, "%15[a-z]", got);
    int ok = 0;
    char alts[32];
    snprintf(alts, sizeof alts, "%s", m->memory_mode);
    for (char *sv = NULL, *w = strtok_r(alts, "|", &sv); w; w = strtok_r(NULL, "|", &sv))
      ok |= strcmp(w, got) == 0;
    check(ok, "plan reports memory_mode %s (want %s)", got, m->memory_mode);
  }
  if (me == 0) {
    if (hbm < 0)
      check(strstr(notice, "DDR") && strstr(notice, m && m->hbm_base < 0 ? "cache" : "DDR"),
            "no HBM node: the notice says DDR%s: \"%s\"", m && m->hbm_base < 0 ? " and cache" : "",
            notice);
    else if (!want_ddr)
      check(strstr(notice, "HBM") != NULL, "HBM found: the notice says so: \"%s\"", notice);
    else
      check(strstr(notice, "DDR") != NULL, "memory policy ddr: the notice says DDR: \"%s\"", notice);
    if (hbm < 0 && want_strict)
      check(report && strstr(report, "asks for HBM"), "hbm_bind without HBM: the plan says it uses DDR");
  }

  /* the process runs in its cluster */
  cpu_set_t aff;
  CPU_ZERO(&aff);
  if (sched_getaffinity(0, sizeof aff, &aff) != 0) {
    check(0, "sched_getaffinity: %s", strerror(errno));
  } else if (!bind_none) {
    char list[256] = "";
    size_t len = 0;
    for (int c = 0; c < MAXCPUS && len + 8 < sizeof list; c++)
      if (CPU_ISSET(c, &aff)) len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", len ? "," : "", c);
    int in = cluster_of_set(&aff);
    check(in == cl_want, "affinity {%s} lies in cluster %d (node %d CPUs; want cluster %d)", list, in,
          in >= 0 ? g_cluster_node[in] : -1, cl_want);
    if (bind_core)
      check(CPU_COUNT(&aff) == 1 && CPU_ISSET(plan_pu < 0 ? 0 : plan_pu, &aff),
            "bind core: affinity is exactly the planned PU %d", plan_pu);
    if (bind_cluster)
      check(CPU_EQUAL(&aff, &g_node[cl_node].cpus), "bind cluster: affinity is every CPU of node %d",
            cl_node);
    int cpu = sched_getcpu();
    check(cluster_of_cpu(cpu) == cl_want, "running on CPU %d, in cluster %d (want %d)", cpu,
          cluster_of_cpu(cpu), cl_want);
  }

  /* communicator, placed by rank 0 through the callback */
  coll_comm_config_t cfg = {.rank = me, .size = P, .job_key = job_key, .place = place_cb,
                            .place_arg = ctx};
  coll_comm_t *comm = NULL;
  rc = coll_comm_create(&cfg, &comm);
  if (rc) {
    const char *text = "";
    coll_comm_error(comm, &text);
    check(0, "coll_comm_create: %s (%s)", coll_strerror(rc), text);
    coll_comm_free(comm);
    coll_numa_free(ctx);
    free(report);
    return 1;
  }
  check(1, "coll_comm_create: %d ranks", P);
  if (me == 0)
    check(g_place.calls == 1 + P && g_place.failed == 0 && g_place.unbound == 0,
          "place callback: %d calls (want %d), %d failed, %d left unbound, %d MPOL_BIND%s%s",
          g_place.calls, 1 + P, g_place.failed, g_place.unbound, g_place.strict,
          g_place.notice[0] ? "; notice: " : "", g_place.notice);
  /* hbm_bind: a strict bind wherever the part fits in its HBM node (small arenas here) */
  if (me == 0 && want_strict && hbm >= 0 && comm->hdr->arena_bytes <= ((size_t)32 << 20))
    check(g_place.strict == g_place.calls, "hbm_bind: %d of %d placements MPOL_BIND", g_place.strict,
          g_place.calls);

  /* which cluster each rank really is in: the control+staging area belongs to
   * the cluster with the most ranks (ties: the lowest) */
  int32_t mine = cluster_of_set(&aff), all[MAXCPUS];
  if (bind_none) mine = cl_want;
  coll_args_t ag = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 1, .send = &mine, .recv = all};
  int staging_node = -1;
  if (P <= MAXCPUS && check(coll_run(comm, &ag) == 0, "allgather of the ranks' clusters")) {
    int cnt[MAXNODES] = {0}, best = 0;
    for (int r = 0; r < P; r++)
      if (all[r] >= 0 && all[r] < MAXNODES) cnt[all[r]]++;
    for (int c = 1; c < g_ncl; c++)
      if (cnt[c] > cnt[best]) best = c;
    int h = sysfs_hbm_of(g_cluster_node[best]);
    staging_node = (h < 0 || want_ddr) ? g_cluster_node[best] : h;
  }

  /* allreduce float32 sum, both algorithms, small and a few MiB, private buffers */
  static const size_t counts[] = {1, 5, 1000, 4099, 1 << 20, (3 << 19) + 13};
  size_t maxc = 0;
  for (size_t k = 0; k < sizeof counts / sizeof *counts; k++) maxc = counts[k] > maxc ? counts[k] : maxc;
  float *send = malloc(maxc * sizeof *send), *recv = malloc(maxc * sizeof *recv);
  const char *algos[] = {"flat", "rsag"};
  for (int al = 0; al < 2 && send && recv; al++) {
    char err[256] = "";
    int bad = coll_set_algorithm(comm, COLL_ALLREDUCE, algos[al]);
    for (size_t k = 0; k < sizeof counts / sizeof *counts && !bad; k++)
      bad = allreduce_once(comm, send, recv, counts[k], P, me, err, sizeof err);
    check(!bad, "allreduce float32 sum, %s, counts 1..%zu (%.1f MiB)%s%s", algos[al], maxc,
          (double)maxc * 4 / (1 << 20), bad ? ": " : "", err);
    if (bad) break;
  }
  free(send);
  free(recv);

  /* control + staging area: placed by rank 0 for every rank, pre-faulted */
  if (me == 0 && staging_node >= 0) {
    const coll__header_t *h = comm->hdr;
    check_pages("control+staging area", comm->base + h->ctl_off, h->arena_off - h->ctl_off, staging_node);
  }

  /* this rank's arena part: its cluster's node, whoever faults the page */
  size_t abytes = (size_t)4 << 20;
  void *abuf = NULL, *bbuf = NULL;
  rc = coll_arena_alloc(comm, abytes, 4096, &abuf);
  if (check(rc == 0, "coll_arena_alloc(4 MiB): %s", rc ? coll_strerror(rc) : "ok")) {
    memset(abuf, 0x5a, abytes);
    check_pages("own arena buffer (touched by this rank)", abuf, abytes, mem_want);
  }
  /* zero-copy allreduce (both buffers in the arena), then the pages again */
  rc = coll_arena_alloc(comm, abytes, 4096, &bbuf);
  if (abuf && rc == 0) {
    char err[256] = "";
    int bad = coll_set_algorithm(comm, COLL_ALLREDUCE, "rsag");
    if (!bad) bad = allreduce_once(comm, abuf, bbuf, abytes / 4, P, me, err, sizeof err);
    check(!bad, "zero-copy allreduce (arena buffers, rsag, 4 MiB)%s%s", bad ? ": " : "", err);
    check_pages("arena output buffer (written by the collective)", bbuf, abytes, mem_want);
  }
  /* a page of the next rank's arena part, first touched here (another CPU,
   * maybe another cluster): the policy lives on the memfd, so it must land on
   * the next rank's node. The tail of its part is never handed out here. */
  if (P > 1 && comm->hdr->arena_bytes >= 4 * abytes) {
    const coll__header_t *h = comm->hdr;
    int peer = (me + 1) % P;
    int pcl = expected_cluster(peer, P);
    int ph = sysfs_hbm_of(g_cluster_node[pcl]);
    int pwant = (ph < 0 || want_ddr) ? g_cluster_node[pcl] : ph;
    size_t tail = (size_t)256 << 10;
    uint8_t *p = comm->base + h->arena_off + (size_t)(peer + 1) * h->arena_bytes - tail;
    memset(p, 0xa5, tail);
    char what[96];
    snprintf(what, sizeof what, "rank %d's arena part, first touched by this rank", peer);
    check_pages(what, p, tail, pwant);
  }
  void *pool = NULL; /* a memory server's pool (hbmcoll-memserver): where this rank's buffers go */
  int pnode = -1;
  if (me == 0 && check(coll_numa_pool_alloc(ctx, 8 << 20, &pool, &pnode) == 0, "memory server pool allocated")) {
    memset(pool, 0x5a, 8 << 20); /* data: a THP of zeros may be split to the zero page */
    check_pages("memory server pool", pool, 8 << 20, mem_want);
    check(pnode == mem_want, "the memory server pool says node %d (want %d)", pnode, mem_want);
    coll_numa_scratch_free(ctx, pool, 8 << 20);
  }
  const char *stall = getenv("KNL_CHECK_STALL"); /* self-test: this rank hangs here */
  if (stall && *stall && atoi(stall) == me) {
    out("STALL [%s] rank %d stops before the final barrier (KNL_CHECK_STALL)", g_mode, me);
    for (;;) pause();
  }
  coll_args_t bar = {.kind = COLL_BARRIER};
  rc = coll_run(comm, &bar);
  const char *etext = "";
  if (rc) coll_comm_error(comm, &etext);
  check(rc == 0, "final barrier%s%s%s%s", rc ? ": " : "", rc ? coll_strerror(rc) : "", rc ? ": " : "",
        etext);
  coll_arena_free(comm, abuf);
  coll_arena_free(comm, bbuf);
  coll_comm_free(comm);
  coll_numa_free(ctx);
  free(report);
  return 0;
}

int main(int argc, char **argv) {
  int P = 0;
  const knl_mode_t *m = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
      P = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
      const char *name = argv[++i];
      for (size_t k = 0; k < sizeof g_modes / sizeof *g_modes; k++)
        if (strcmp(g_modes[k].name, name) == 0) m = &g_modes[k];
      if (m == NULL) {
        fprintf(stderr, "knl_check: unknown mode %s\n", name);
        return 2;
      }
    } else {
      fprintf(stderr, "usage: knl_check [--mode MODE] [-n RANKS]\n");
      return 2;
    }
  }
  g_mode = m ? m->name : "-";
  if (P <= 0) P = (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (P < 1 || P > MAXCPUS) P = 1;
  g_res = mmap(NULL, sizeof *g_res, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_res == MAP_FAILED) return 1;
  sysfs_load();
  check(g_ncl > 0, "sysfs: %d NUMA node(s) with CPUs, %d rank(s)", g_ncl, P);
  if (g_ncl == 0) goto done;

  char key[64];
  snprintf(key, sizeof key, "knl-check-%d", (int)getpid());
  pid_t *pids = calloc((size_t)P, sizeof *pids);
  if (pids == NULL) return 1;
  for (int r = 0; r < P; r++) {
    pids[r] = fork();
    if (pids[r] == 0) _exit(run_rank(r, P, m, key));
    if (pids[r] < 0) {
      check(0, "fork rank %d: %s", r, strerror(errno));
      pids[r] = 0;
    }
  }
  for (int r = 0; r < P; r++) {
    int st;
    if (pids[r] <= 0 || waitpid(pids[r], &st, 0) < 0) continue;
    if (WIFSIGNALED(st))
      check(0, "rank %d killed by signal %d (%s)%s", r, WTERMSIG(st), strsignal(WTERMSIG(st)),
            WTERMSIG(st) == SIGALRM ? ": over its deadline" : "");
    else if (WEXITSTATUS(st) != 0)
      check(0, "rank %d exited with status %d", r, WEXITSTATUS(st));
  }
  free(pids);
done:;
  int pass = atomic_load(&g_res->passed), fail = atomic_load(&g_res->failed);
  out("%d passed, %d failed", pass, fail);
  const char *tally = getenv("KNL_CHECK_TALLY"); /* the guest's /init adds up several runs */
  FILE *t = tally && *tally ? fopen(tally, "a") : NULL;
  if (t) fprintf(t, "%d %d\n", pass, fail), fclose(t);
  return fail || pass == 0 ? 1 : 0;
}
