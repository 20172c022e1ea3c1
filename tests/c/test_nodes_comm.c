/*
 * test_nodes_comm.c - a coll_comm_t that spans nodes, from C (libcoll/src/nodes_*.c): two emulated
 * nodes (network namespaces, tests/c/netns.h) of two ranks each. The node's communicator meets on
 * an abstract Unix socket, which lives in the network namespace, so each node is a process that
 * enters its namespace and then forks its local ranks; every rank joins with coll_job_create from
 * the variables hbmcoll-run would give it (HBMCOLL_RANK..., HBMCOLL_JOB_KEY, HBMCOLL_MASTER,
 * HBMCOLL_PORT, HBMCOLL_IFACE, HBMCOLL_NODE), through the C rendezvous and rings.
 *
 *  - every collective through coll_run on the job's communicator, against values each rank computes
 *    from every rank's inputs: int32, float32 and float64; SUM everywhere, PROD, MIN, MAX and AVG
 *    for allreduce; roots on both nodes; counts 0, 1, 7, 1000 (past the meeting's small path) and
 *    70000 (the rings, in chunks); then the same through coll_start, several calls in flight;
 *  - rank, size, the node's arena, coll_comm_algorithm, coll_comm_stage_streaming (the node's probe);
 *  - splits: groups across the nodes (one rank per node, three ranks on unequal nodes, all four in an
 *    order that interleaves the nodes), groups on one node, a rank in none, a split of a split;
 *    each group's rank, size and collectives (the rings too) checked, then the parent used again; a
 *    rank killed in a split: EPEERLOST in its group and every rank's parent, then in the other group;
 *  - a disagreement (one rank's count differs) is COLL_EMISMATCH on every rank, with a sentence,
 *    and the next call succeeds;
 *  - a rank killed (SIGKILL) after a first call: COLL_EPEERLOST on every other rank of both nodes;
 *  - a rendezvous whose node never comes names the address, port and the missing ranks.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbnc"
#define NODES 2
#define PER 2
#define SIZE (NODES * PER)
#define HARNESS_NAME_WIDTH 48
#include "harness.h"
#include "netns.h"
#include "nodes_job.h"



static double val(int r, size_t i) { return (double)((r * 7 + (int)(i % 1000) * 3) % 11) - 5.0; }

static void put(coll_dtype_t t, void *b, size_t i, double v) {
  if (t == COLL_INT32) ((int32_t *)b)[i] = (int32_t)v;
  else if (t == COLL_FLOAT32) ((float *)b)[i] = (float)v;
  else ((double *)b)[i] = v;
}
static double get(coll_dtype_t t, const void *b, size_t i) {
  return t == COLL_INT32 ? ((const int32_t *)b)[i] : t == COLL_FLOAT32 ? ((const float *)b)[i] : ((const double *)b)[i];
}
static double fold(coll_op_t op, double a, double b) {
  return op == COLL_PROD ? a * b : op == COLL_MIN ? fmin(a, b) : op == COLL_MAX ? fmax(a, b) : a + b;
}
static double folded(coll_op_t op, coll_dtype_t t, size_t i, int off) { /* over every rank's val(r, i + off) */
  double v = val(0, i + (size_t)off);
  for (int r = 1; r < SIZE; r++) v = fold(op, v, val(r, i + (size_t)off));
  if (op == COLL_AVG) v = t == COLL_INT32 ? (double)(int32_t)(v / SIZE) : v / SIZE;
  return v;
}

static int say(int rank, const char *what, int rc, coll_comm_t *c) {
  const char *text = "";
  coll_comm_error(c, &text);
  fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, coll_err_name(rc), text ? text : "");
  return 1;
}

/* One collective on comm (nonblocking when req_p), its buffers made and later checked by check(). */
typedef struct {
  coll_args_t a;
  void *send, *recv;
} call_t;

static void make(call_t *k, coll_kind_t kind, coll_dtype_t t, coll_op_t op, int root, size_t count, int rank) {
  size_t es = coll_dtype_size(t), all = count * SIZE;
  k->send = calloc(all + 1, es), k->recv = calloc(all + 1, es);
  k->a = (coll_args_t){.kind = kind, .dtype = t, .op = op, .root = root, .count = count, .send = k->send, .recv = k->recv};
  for (size_t i = 0; i < all; i++) put(t, k->send, i, val(rank, i));
  if (kind == COLL_BCAST)
    for (size_t i = 0; i < count; i++) put(t, k->recv, i, rank == root ? val(rank, i) : -99);
  if (kind == COLL_ALLTOALL)
    for (size_t i = 0; i < all; i++) put(t, k->send, i, (double)(rank * 100 + (int)(i / (count ? count : 1)) * 10) + (double)(i % 7));
}

static int check(const call_t *k, int rank) {
  const coll_args_t *a = &k->a;
  coll_dtype_t t = a->dtype;
  size_t n = a->count;
  int bad = 0;
  for (size_t i = 0; i < n * SIZE && !bad; i++) {
    size_t b = i / (n ? n : 1), j = i % (n ? n : 1);
    double want = NAN, got = get(t, k->recv, i);
    switch (a->kind) {
    case COLL_ALLREDUCE: if (i < n) want = folded(a->op, t, i, 0); break;
    case COLL_REDUCE: if (i < n && rank == a->root) want = folded(a->op, t, i, 0); break;
    case COLL_BCAST: if (i < n) want = val(a->root, i); break;
    case COLL_ALLGATHER: want = val((int)b, j); break;
    case COLL_GATHER: if (rank == a->root) want = val((int)b, j); break;
    case COLL_SCATTER: if (i < n) want = val(a->root, (size_t)rank * n + i); break;
    case COLL_REDUCE_SCATTER: if (i < n) want = folded(COLL_SUM, t, i, rank * (int)n); break;
    case COLL_ALLTOALL: want = (double)((int)b * 100 + rank * 10) + (double)((rank * n + j) % 7); break;
    default: break;
    }
    if (!isnan(want) && fabs(got - want) > 1e-6 * fmax(1, fabs(want))) {
      fprintf(stderr, "rank %d: %s %s op %s root %d count %zu: [%zu] = %g, want %g\n", rank, coll_kind_name(a->kind),
              coll_dtype_name(t), coll_op_name(a->op), a->root, n, i, got, want);
      bad = 1;
    }
  }
  return bad;
}

static void drop(call_t *k) { free(k->send), free(k->recv); }

static int job_collectives(coll_comm_t *c, int rank) {
  static const size_t counts[] = {0, 1, 7, 1000, 70000};
  static const coll_dtype_t types[] = {COLL_INT32, COLL_FLOAT32, COLL_FLOAT64};
  int bad = 0;
  if (coll_comm_rank(c) != rank || coll_comm_size(c) != SIZE)
    return fprintf(stderr, "rank %d: rank/size %d/%d\n", rank, coll_comm_rank(c), coll_comm_size(c)), 1;
  void *p = NULL;
  if (coll_arena_alloc(c, 4096, 64, &p) != 0 || !coll_arena_contains(c, p, 4096)) bad++, fprintf(stderr, "arena\n");
  coll_arena_free(c, p);
  for (int kind = 0; kind < COLL_KIND_COUNT; kind++)
    for (size_t ti = 0; ti < 3; ti++)
      for (size_t ci = 0; ci < 5; ci++)
        for (int root = 0; root < SIZE; root += 3) {
          coll_op_t ops[] = {COLL_SUM, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG};
          int nops = kind == COLL_ALLREDUCE && ci == 2 ? 5 : 1;
          for (int o = 0; o < nops; o++) {
            if ((kind == COLL_BARRIER && (ti || ci)) || (ops[o] == COLL_PROD && types[ti] != COLL_INT32)) continue;
            call_t k;
            make(&k, (coll_kind_t)kind, types[ti], ops[o], root, counts[ci], rank);
            int rc = coll_run(c, &k.a);
            if (rc) bad += say(rank, coll_kind_name((coll_kind_t)kind), rc, c);
            else bad += check(&k, rank);
            drop(&k);
            if (bad) return bad;
          }
        }
  if (coll_comm_algorithm(c)[0] == '\0') bad++, fprintf(stderr, "no algorithm named\n");
  /* staging with streaming stores is the node communicator's, which measured it where each of its
   * ranks has a CPU (stage_probe.c): the job's communicator reports that, not "never measured" */
  double probe[2];
  size_t from = coll_comm_stage_streaming(c, probe);
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof cpus, &cpus) == 0 && CPU_COUNT(&cpus) >= PER &&
      (probe[0] <= 0 || probe[1] <= 0 || (from != 0 && from != 32 << 10)))
    bad++, fprintf(stderr, "rank %d: staging from %zu, probe %g / %g s\n", rank, from, probe[0], probe[1]);
  /* nonblocking: every kind in flight at once, then a blocking call behind them */
  call_t ks[COLL_KIND_COUNT];
  coll_req_t *reqs[COLL_KIND_COUNT];
  for (int kind = 0; kind < COLL_KIND_COUNT; kind++) {
    make(&ks[kind], (coll_kind_t)kind, COLL_FLOAT32, COLL_SUM, kind % SIZE, kind % 2 ? 70000 : 5, rank);
    int rc = coll_start(c, &ks[kind].a, &reqs[kind]);
    if (rc) return say(rank, "coll_start", rc, c);
  }
  call_t last;
  make(&last, COLL_ALLREDUCE, COLL_INT32, COLL_SUM, 0, 3, rank);
  int rc = coll_run(c, &last.a);
  if (rc) bad += say(rank, "a blocking call behind started ones", rc, c);
  else bad += check(&last, rank);
  drop(&last);
  for (int kind = 0; kind < COLL_KIND_COUNT; kind++) {
    int result = -1;
    if (coll_req_test(reqs[kind], &result) != 1) bad++, fprintf(stderr, "rank %d: request %d not done\n", rank, kind);
    else if (result) bad += say(rank, "started call", result, c);
    else bad += check(&ks[kind], rank);
    coll_req_free(reqs[kind]);
    drop(&ks[kind]);
  }
  return bad + (coll_comm_settle(c) != 0);
}

/* sub's rank and size, and its collectives, for the group of parent ranks members[0..n). */
static int sub_check(coll_comm_t *sub, int rank, const int *members, int n, const char *what) {
  int me = 0, bad = 0, rc;
  while (me < n && members[me] != rank) me++;
  if (coll_comm_size(sub) != n || coll_comm_rank(sub) != me)
    return fprintf(stderr, "rank %d: %s: rank/size %d/%d, want %d/%d\n", rank, what, coll_comm_rank(sub),
                   coll_comm_size(sub), me, n), 1;
  int32_t mine = rank, all[SIZE] = {0}, want = 0;
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 1, .send = &mine, .recv = all};
  if ((rc = coll_run(sub, &a)) != 0) return say(rank, what, rc, sub);
  for (int i = 0; i < n; i++) bad += all[i] != members[i], want += members[i] + 1;
  size_t count = 70000; /* past the meeting: the group's rings */
  float *big = malloc(count * sizeof *big);
  for (size_t i = 0; i < count; i++) big[i] = (float)(rank + 1) * (float)(i % 5);
  a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = count, .send = big, .recv = big};
  if ((rc = coll_run(sub, &a)) != 0) bad += say(rank, what, rc, sub);
  for (size_t i = 0; i < count && !bad; i++) bad += big[i] != (float)want * (float)(i % 5);
  for (size_t i = 0; i < 1000; i++) big[i] = me == n - 1 ? (float)i : -1.0f;
  a = (coll_args_t){.kind = COLL_BCAST, .dtype = COLL_FLOAT32, .root = n - 1, .count = 1000, .send = big, .recv = big};
  if (rc == 0 && (rc = coll_run(sub, &a)) != 0) bad += say(rank, what, rc, sub);
  for (size_t i = 0; i < 1000 && !bad; i++) bad += big[i] != (float)i;
  free(big);
  if (bad) fprintf(stderr, "rank %d: %s: wrong results\n", rank, what);
  return bad;
}

static int job_split(coll_comm_t *c, int rank) {
  static const struct {
    const char *what;
    int color[SIZE], key[SIZE], n[SIZE], members[SIZE][SIZE];
  } cases[] = {
      {"one rank per node, keys reversed", {0, 1, 0, 1}, {0, -1, -2, -3}, {2, 2, 2, 2},
       {{2, 0}, {3, 1}, {2, 0}, {3, 1}}},
      {"each node alone", {0, 0, 1, 1}, {0, 0, 0, 0}, {2, 2, 2, 2}, {{0, 1}, {0, 1}, {2, 3}, {2, 3}}},
      {"unequal nodes, rank 3 in none", {0, 0, 0, -1}, {0, 1, 2, 3}, {3, 3, 3, 0}, {{0, 1, 2}, {0, 1, 2}, {0, 1, 2}}},
      {"the nodes interleaved", {5, 5, 5, 5}, {1, 2, 3, 0}, {4, 4, 4, 4},
       {{3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2}}},
  };
  int bad = 0;
  coll_comm_t *first = NULL;
  for (size_t k = 0; k < sizeof cases / sizeof cases[0] && !bad; k++) {
    coll_comm_t *sub = NULL;
    int rc = coll_comm_split(c, cases[k].color[rank], cases[k].key[rank], &sub);
    if (rc) return say(rank, cases[k].what, rc, c);
    if (cases[k].n[rank] == 0) bad += sub != NULL;
    else bad += sub == NULL || sub_check(sub, rank, cases[k].members[rank], cases[k].n[rank], cases[k].what);
    if (k == 0) first = sub;
    else coll_comm_free(sub);
  }
  coll_comm_t *again = NULL; /* a split of a split across the nodes: the same group */
  int rc = bad ? 0 : coll_comm_split(first, 0, 0, &again);
  if (rc) bad += say(rank, "a split of a split", rc, first);
  else if (!bad) bad += sub_check(again, rank, cases[0].members[rank], 2, "a split of a split");
  coll_comm_free(again);
  coll_comm_free(first);
  int32_t one = 1, sum = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &one, .recv = &sum};
  if (!bad && ((rc = coll_run(c, &a)) != 0 || sum != SIZE)) bad += say(rank, "the parent after its splits", rc, c);
  return bad;
}

static int job_mismatch(coll_comm_t *c, int rank) {
  int32_t in[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8];
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = rank == 2 ? 8 : 7,
                   .send = in, .recv = out};
  int rc = coll_run(c, &a);
  const char *text = "";
  coll_comm_error(c, &text);
  if (rc != COLL_EMISMATCH || !strstr(text, "disagree"))
    return fprintf(stderr, "rank %d: a disagreement gave %s (%s)\n", rank, coll_err_name(rc), text), 1;
  a.count = 7;
  if ((rc = coll_run(c, &a)) != 0 || out[6] != SIZE) return say(rank, "the call after a disagreement", rc, c);
  return 0;
}

static int job_killed(coll_comm_t *c, int rank) {
  int32_t in = 1, out = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &in, .recv = &out};
  int rc = coll_run(c, &a);
  if (rc || out != SIZE) return say(rank, "the first call", rc, c);
  if (rank == 3) raise(SIGKILL);
  rc = coll_run(c, &a);
  if (rc != COLL_EPEERLOST) return fprintf(stderr, "rank %d: after rank 3 was killed: %s\n", rank, coll_err_name(rc)), 1;
  const char *text = "";
  coll_comm_error(c, &text);
  printf("    rank %d: %s\n", rank, text);
  return 0;
}

/* A rank killed while its split works: its group mate's split ends with EPEERLOST, and so does every
 * rank's parent; the other group's split goes on (its ranks are alive) until its parent ended. */
static int job_split_killed(coll_comm_t *c, int rank) {
  coll_comm_t *sub = NULL;
  int rc = coll_comm_split(c, rank % 2, 0, &sub);
  if (rc) return say(rank, "split", rc, c);
  int32_t in = 1, out = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &in, .recv = &out};
  if ((rc = coll_run(sub, &a)) != 0 || out != 2) return say(rank, "the split's first call", rc, sub);
  if (rank == 3) raise(SIGKILL);
  rc = coll_run(sub, &a);
  int prc = coll_run(c, &a), after = coll_run(sub, &a);
  coll_comm_free(sub);
  if (rc != (rank == 1 ? COLL_EPEERLOST : 0) || prc != COLL_EPEERLOST || after != COLL_EPEERLOST)
    return fprintf(stderr, "rank %d: after rank 3 was killed: split %s, parent %s, split again %s\n", rank,
                   coll_err_name(rc), coll_err_name(prc), coll_err_name(after)), 1;
  return 0;
}

static int job_missing(coll_comm_t *c, int rank) { (void)c, (void)rank; return 1; /* never joins */ }

int main(void) {
  const scenario_t all[] = {
      {"every collective across 2 nodes x 2, blocking and started", job_collectives, -1, 0},
      {"splits: across the nodes, on one node, nested", job_split, -1, 0},
      {"a rank killed in a split: EPEERLOST there, then everywhere", job_split_killed, 3, 0},
      {"a disagreement is EMISMATCH everywhere, then usable", job_mismatch, -1, 0},
      {"a killed rank is EPEERLOST on both nodes", job_killed, 3, 0},
      {"a missing node is named with address and ranks", job_missing, -1, 1},
  };
  return scenarios_run(all, sizeof all / sizeof all[0], "collectives across emulated nodes", 31000);
}
