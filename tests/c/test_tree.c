/*
 * test_tree.c - the tree small collectives run on with many ranks (tree.c, algo_tree.c).
 *
 *   build      coll_tree_build for 1..300 ranks, unbound, KNL-like tiles of two cores (in one
 *              or four clusters), tiles of eight hardware threads, clusters interleaved,
 *              ranks shuffled over the CPUs: one root (on the lowest CPU), connected, no
 *              rank with more than COLL_TREE_FANOUT children, a tile's ranks under its first
 *              rank, (clusters - 1) edges between clusters, depth of a tree of 4 children
 *   results    barrier, bcast, gather, reduce and allreduce from every root on the tree
 *              (forced at P = 3, 5, 9 and 16; and the default choice at 16), interleaved with
 *              flat and rsag collectives that reuse the same slots; AVG divided once
 *   default    above COLL_TREE_FANOUT ranks the tree when every rank has a CPU, else flat
 *   mismatch   disagreements that give the ranks different trees (different roots, kinds,
 *              counts): COLL_EMISMATCH on every rank, no hang
 *   peerlost   a rank killed before it calls: every rank of the tree learns it
 *
 * Usage: test_tree [case-substring]
 */
#define HARNESS_KEY_PREFIX "hbtree"
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <unistd.h>

#include "harness.h"

#define MAX_P 16

/* ---- build ---------------------------------------------------------------------------- */

static unsigned tree_rand_state = 12345;
static unsigned tree_rand(void) { return tree_rand_state = tree_rand_state * 1103515245u + 12345u; }

/* One shape: pu[r] (-1 unbound), tile[r], cluster[r]; checks what the header promises. */
static int check_shape(const char *what, int n, const int *pu, const int *tile, const int *cluster, int tiled) {
  static int parent[400], nchild[400];
  int bad = 0, root = -1, depth = 0;
  EXPECT(coll_tree_build(n, pu, tile, cluster, parent) == 0, "%s n=%d: build failed", what, n);
  for (int r = 0; r < n; r++) nchild[r] = 0;
  for (int r = 0; r < n; r++) {
    if (parent[r] < 0) {
      EXPECT(root < 0, "%s n=%d: two roots %d and %d", what, n, root, r);
      root = r;
    } else {
      EXPECT(parent[r] < n && parent[r] != r, "%s n=%d: parent of %d is %d", what, n, r, parent[r]);
      nchild[parent[r]]++;
    }
  }
  EXPECT(root >= 0, "%s n=%d: no root", what, n);
  for (int r = 0; r < n && !bad; r++) {
    EXPECT(nchild[r] <= COLL_TREE_FANOUT, "%s n=%d: rank %d has %d children", what, n, r, nchild[r]);
    if (pu[r] >= 0 && root >= 0) EXPECT(pu[root] <= pu[r], "%s n=%d: root not on the lowest CPU", what, n);
    int d = 0, x = r;
    while (x != root && d <= n && x >= 0) x = parent[x], d++;
    EXPECT(x == root, "%s n=%d: rank %d does not reach the root", what, n, r);
    if (d > depth) depth = d;
    /* a rank whose tile has an earlier rank hangs off it (two per tile: its only partner) */
    if (tiled && parent[r] >= 0 && tile[r] >= 0) {
      int partner_first = 0;
      for (int q = 0; q < n; q++)
        if (q != r && tile[q] == tile[r] && pu[q] < pu[r]) partner_first = 1;
      if (partner_first) EXPECT(tile[parent[r]] == tile[r], "%s n=%d: rank %d not under its tile", what, n, r);
    }
  }
  int levels = 1; /* leaders in a tree of at least 4 children, plus one level of tile ranks */
  for (long span = 1, width = 1; span < n; levels++) width *= 4, span += width;
  EXPECT(depth <= levels + 1, "%s n=%d: depth %d, want at most %d", what, n, depth, levels + 1);
  int crossing = 0, clusters = 0;
  for (int r = 0; r < n; r++) {
    crossing += parent[r] >= 0 && cluster[parent[r]] != cluster[r];
    int first = 1;
    for (int q = 0; q < r; q++) first &= cluster[q] != cluster[r];
    clusters += first;
  }
  EXPECT(crossing <= clusters - 1, "%s n=%d: %d edges between %d clusters", what, n, crossing, clusters);
  EXPECT(coll_tree_build(0, pu, tile, cluster, parent) == COLL_EBADARG, "n=0 accepted");
  return bad;
}

static void test_build(void) {
  static int pu[400], tile[400], cpu[400], cluster[400];
  int bad = 0;
  double t0 = now_s();
  for (int n = 1; n <= 300 && !bad; n++) {
    for (int r = 0; r < n; r++) pu[r] = -1, tile[r] = -1, cluster[r] = -1;
    bad |= check_shape("unbound", n, pu, tile, cluster, 0);
    for (int r = 0; r < n; r++) cpu[r] = r;
    for (int r = n - 1; r > 0; r--) { /* ranks shuffled over the CPUs */
      int j = (int)(tree_rand() % (unsigned)(r + 1)), x = cpu[r];
      cpu[r] = cpu[j], cpu[j] = x;
    }
    for (int r = 0; r < n; r++) pu[r] = cpu[r] * 4, tile[r] = cpu[r] / 2 * 8, cluster[r] = 0; /* KNL: 2 cores */
    bad |= check_shape("tiles of two cores", n, pu, tile, cluster, 1);
    for (int r = 0; r < n; r++) cluster[r] = cpu[r] / 2 / (((n + 1) / 2 + 3) / 4); /* SNC-4: whole tiles */
    bad |= check_shape("tiles of two cores, four clusters", n, pu, tile, cluster, 1);
    for (int r = 0; r < n; r++) pu[r] = cpu[r], tile[r] = cpu[r] / 8 * 8, cluster[r] = 0; /* 8 threads a tile */
    bad |= check_shape("tiles of eight threads", n, pu, tile, cluster, 0);
    for (int r = 0; r < n; r++) tile[r] = -1, cluster[r] = cpu[r] % 3;
    bad |= check_shape("clusters interleaved", n, pu, tile, cluster, 0);
  }
  record(!bad, "build: shapes for 1..300 ranks", 1, now_s() - t0, NULL);
}

/* ---- results -------------------------------------------------------------------------- */

static int run(coll_comm_t *c, coll_kind_t kind, coll_dtype_t dtype, coll_op_t op, int root, size_t count,
               const void *send, void *recv) {
  coll_args_t a = {.kind = kind, .dtype = dtype, .op = op, .root = root, .count = count,
                   .send = send, .recv = recv};
  return coll_run(c, &a);
}

static int rank_results(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0;
  static float big_in[65536], big_out[65536]; /* flat/rsag in between: the same slots */
  for (int i = 0; i < 65536; i++) big_in[i] = (float)(rank + i % 7);
  for (int iter = 0; iter < 6 && !bad; iter++) {
    EXPECT(run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL) == 0, "barrier");
    for (int root = 0; root < size && !bad; root++) {
      int32_t b[7];
      for (int i = 0; i < 7; i++) b[i] = rank == root ? root * 1000 + i + iter : -1;
      EXPECT(run(c, COLL_BCAST, COLL_INT32, COLL_SUM, root, 7, NULL, b) == 0, "bcast");
      for (int i = 0; i < 7; i++) EXPECT(b[i] == root * 1000 + i + iter, "rank %d bcast root %d [%d] = %d", rank, root, i, b[i]);
      int32_t g_in[3], g_out[3 * MAX_P];
      for (int i = 0; i < 3; i++) g_in[i] = rank * 100 + i + iter;
      EXPECT(run(c, COLL_GATHER, COLL_INT32, COLL_SUM, root, 3, g_in, g_out) == 0, "gather");
      for (int q = 0; q < size && rank == root; q++)
        for (int i = 0; i < 3; i++)
          EXPECT(g_out[q * 3 + i] == q * 100 + i + iter, "rank %d gather root %d from %d [%d] = %d", rank, root, q, i, g_out[q * 3 + i]);
      int64_t r_in[5], r_out[5];
      for (int i = 0; i < 5; i++) r_in[i] = (int64_t)(rank + 1) * (i + 1);
      EXPECT(run(c, COLL_REDUCE, COLL_INT64, COLL_SUM, root, 5, r_in, r_out) == 0, "reduce");
      for (int i = 0; i < 5 && rank == root; i++)
        EXPECT(r_out[i] == (int64_t)size * (size + 1) / 2 * (i + 1), "rank %d reduce root %d [%d] = %lld", rank, root, i, (long long)r_out[i]);
    }
    double avg[4], mx[4];
    for (int i = 0; i < 4; i++) avg[i] = mx[i] = rank * 4 + i;
    EXPECT(run(c, COLL_ALLREDUCE, COLL_FLOAT64, COLL_AVG, 0, 4, avg, avg) == 0, "allreduce avg");
    EXPECT(run(c, COLL_ALLREDUCE, COLL_FLOAT64, COLL_MAX, 0, 4, mx, mx) == 0, "allreduce max");
    for (int i = 0; i < 4; i++) {
      EXPECT(avg[i] == (size - 1) * 2.0 + i, "rank %d avg[%d] = %g", rank, i, avg[i]);
      EXPECT(mx[i] == (size - 1) * 4.0 + i, "rank %d max[%d] = %g", rank, i, mx[i]);
    }
    EXPECT(run(c, COLL_ALLREDUCE, COLL_FLOAT32, COLL_SUM, 0, 0, NULL, NULL) == 0, "empty allreduce");
    EXPECT(run(c, COLL_ALLREDUCE, COLL_FLOAT32, COLL_SUM, 0, 65536, big_in, big_out) == 0, "64K allreduce");
    float want = (float)size * (size - 1) / 2 + (float)size * 3; /* at i % 7 == 3 */
    EXPECT(big_out[3] == want, "rank %d big allreduce %g want %g", rank, big_out[3], want);
  }
  coll_comm_free(c);
  return bad;
}

/* ---- mismatch and peerlost ------------------------------------------------------------- */

typedef struct {
  const char *name;
  int odd;     /* the rank that calls something else */
  int variant; /* 0 bcast root, 1 reduce: every rank names itself, 2 barrier vs allreduce, 3 count,
                * 4 one rank forces the flat barrier (so the others are not on it) */
} tree_mm_t;

static int rank_mismatch(int rank, int size, const char *key, void *arg) {
  const tree_mm_t *m = arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 20, &c)) return 1; /* a hang shows up as ETIMEDOUT */
  int bad = 0, odd = rank == m->odd % size, rc;
  int32_t buf[8] = {0}, out[8];
  rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
  const char *why = "";
  if (rc) coll_comm_error(c, &why);
  EXPECT(rc == 0, "rank %d: first barrier: %s: %s", rank, coll_err_name(rc), why);
  if (m->variant == 0) rc = run(c, COLL_BCAST, COLL_INT32, COLL_SUM, odd ? 2 : 1, 8, NULL, buf);
  else if (m->variant == 1) rc = run(c, COLL_REDUCE, COLL_INT32, COLL_SUM, rank, 8, buf, out);
  else if (m->variant == 4) {
    if (odd) EXPECT(coll_set_algorithm(c, COLL_BARRIER, "flat") == 0, "set flat");
    rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
    const char *text = "";
    coll_comm_error(c, &text);
    EXPECT(strstr(text, "algorithm") != NULL, "rank %d: '%s' names no algorithm", rank, text);
  } else if (m->variant == 2 && odd) rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
  else rc = run(c, COLL_ALLREDUCE, COLL_INT32, COLL_SUM, 0, odd ? 5 : 4, buf, out);
  EXPECT(rc == COLL_EMISMATCH, "rank %d: %s: got %s", rank, m->name, coll_err_name(rc));
  rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
  EXPECT(rc == COLL_EMISMATCH, "rank %d: after it: %s", rank, coll_err_name(rc));
  coll_comm_free(c);
  return bad;
}

/* Ten ranks, one forced to the flat barrier: the others agree with it exactly when the job
 * has fewer CPUs than ranks (oversubscribed, flat is the default). */
static int rank_default(int rank, int size, const char *key, void *arg) {
  (void)arg;
  cpu_set_t set;
  int bad = 0, quota_cpus = 1 << 20;
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f) {
    char q[32];
    long period = 0;
    if (fscanf(f, "%31s %ld", q, &period) == 2 && strcmp(q, "max") != 0 && period > 0)
      quota_cpus = (int)((atol(q) + period - 1) / period);
    fclose(f);
  }
  sched_getaffinity(0, sizeof set, &set);
  int cpus = CPU_COUNT(&set) < quota_cpus ? CPU_COUNT(&set) : quota_cpus, roomy = cpus >= size;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 20, &c)) return 1;
  if (rank == 3) EXPECT(coll_set_algorithm(c, COLL_BARRIER, "flat") == 0, "set flat");
  int rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
  EXPECT(rc == (roomy ? COLL_EMISMATCH : 0), "rank %d: %d CPUs, %d ranks: got %s", rank, cpus, size,
         coll_err_name(rc));
  coll_comm_free(c);
  return bad;
}

static int rank_dies(int rank, int size, const char *key, void *arg) {
  int victim = (int)(intptr_t)arg, bad = 0;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 20, &c)) return 1;
  if (rank == victim) kill(getpid(), SIGKILL);
  int rc = run(c, COLL_BARRIER, COLL_INT32, COLL_SUM, 0, 0, NULL, NULL);
  EXPECT(rc == COLL_EPEERLOST, "rank %d: got %s, want EPEERLOST", rank, coll_err_name(rc));
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  const char *const forced[] = {"HBMCOLL_ALGO=barrier=tree,bcast=tree,gather=tree,reduce=tree,allreduce=tree", NULL};
  if (CASE("build")) test_build();
  int sizes[] = {3, 5, 9, 16};
  for (int i = 0; i < 4; i++)
    if (CASE("results")) spawn_expect("results: tree forced", sizes[i], 240, forced, rank_results, NULL, -1);
  if (CASE("results")) spawn_expect("results: the default choice", 16, 240, NULL, rank_results, NULL, -1);
  static const tree_mm_t mms[] = {{"mismatch: bcast, one rank names another root", 7, 0},
                                  {"mismatch: reduce, every rank names itself root", 0, 1},
                                  {"mismatch: barrier against allreduce", 5, 2},
                                  {"mismatch: allreduce count on a leaf", 9, 3},
                                  {"mismatch: one rank on the flat barrier", 6, 4}};
  if (CASE("default")) spawn_expect("default: tree with a CPU per rank, else flat", 10, 60, NULL, rank_default, NULL, -1);
  for (size_t i = 0; i < sizeof mms / sizeof mms[0]; i++)
    for (int P = 3; P <= 10; P += 7)
      if (CASE(mms[i].name)) spawn_expect(mms[i].name, P, 60, forced,
                                          rank_mismatch, (void *)&mms[i], -1);
  for (int victim = 0; victim < 10; victim += 4)
    if (CASE("peerlost")) spawn_expect("peerlost: a tree rank killed before the barrier", 10, 60, forced, rank_dies,
                                       (void *)(intptr_t)victim, victim);
  return harness_finish();
}
