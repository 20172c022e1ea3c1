/*
 * test_hier_tuner.c - how the pipelined allreduce across nodes chooses its chunk count
 * (libcoll/src/hier_allreduce.c: coll__hier_propose, coll__hier_took): from the times of the
 * first calls of each size class, or HBMCOLL_PIPELINE_CHUNKS. The pipeline itself runs across
 * emulated nodes in tests/py/test_across_nodes.py (across_job.py repeats a size through every
 * candidate).
 *
 *  turns      each candidate (1, 2, 4, 8) is tried in turn, HIER_TRIES times each; the fastest
 *             by median is kept (one fast call does not win it); later times do not move it;
 *             the same size class shares the choice
 *  small      no piece is cut below HIER_MIN_PIECE
 *  proposer   only node 0's local rank 0 proposes
 *  fixed      HBMCOLL_PIPELINE_CHUNKS fixes the count
 *  bad        a malformed HBMCOLL_PIPELINE_CHUNKS is COLL_EBADARG naming it (coll_env_check)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hier.h"

#define HARNESS_KEY_PREFIX "hbht"
#include "harness.h"

#define MIB ((size_t)1 << 20)

static coll__hier_t *fresh(int node, int local_rank, int fixed) {
  coll__hier_t *h = calloc(1, sizeof *h);
  h->cfg.node = node, h->local_rank = local_rank, h->fixed_chunks = fixed;
  return h;
}

/* Calls of one size until the choice holds: the counts proposed, in order, into seen. */
static int explore(coll__hier_t *h, size_t piece, double (*seconds_of)(int chunks, int nth), int *seen, int max) {
  int n = 0, nth[9] = {0}, key = 0;
  for (size_t v = piece; v; v >>= 1) key++;
  while (n < max) {
    int m = coll__hier_propose(h, piece);
    if (h->tune[key].chosen) break;
    seen[n++] = m;
    coll__hier_took(h, piece, m, seconds_of(m, nth[m]++));
  }
  return n;
}

static double table_time(int chunks, int nth) {
  static const double t[9][3] = {[1] = {5, 9, 5}, [2] = {4, 4, 30}, [4] = {3, 99, 99}, [8] = {6, 6, 6}};
  return t[chunks][nth % 3];
}

static double flat_time(int chunks, int nth) { return (void)chunks, (void)nth, 1.0; }

static void test_turns(void) {
  coll__hier_t *h = fresh(0, 0, 0);
  int seen[32], n = explore(h, 8 * MIB, table_time, seen, 32), ok = n == 4 * HIER_TRIES;
  for (int i = 0; ok && i < n; i++) ok = seen[i] == (int[]){1, 2, 4, 8}[i % 4];
  ok = ok && coll__hier_propose(h, 8 * MIB) == 2; /* medians 5, 4, 99, 6 */
  coll__hier_took(h, 8 * MIB, 2, 1000.0);
  ok = ok && coll__hier_propose(h, 8 * MIB) == 2 && coll__hier_propose(h, 8 * MIB + 1) == 2;
  record(ok, "turns: each in turn, the fastest median kept", 1, 0, ok ? NULL : "wrong order or choice");
  free(h);
}

static void test_small(void) {
  coll__hier_t *h = fresh(0, 0, 0);
  int seen[32], n = explore(h, 3 * HIER_MIN_PIECE, flat_time, seen, 32), ok = n == 2 * HIER_TRIES;
  for (int i = 0; ok && i < n; i++) ok = seen[i] == 1 || seen[i] == 2;
  n = explore(h, HIER_MIN_PIECE - 1, flat_time, seen, 32);
  ok = ok && n == HIER_TRIES;
  for (int i = 0; ok && i < n; i++) ok = seen[i] == 1;
  record(ok, "small: no piece under the minimum", 1, 0, ok ? NULL : "a piece was cut too small");
  free(h);
}

static void test_proposer(void) {
  coll__hier_t *h = fresh(0, 1, 0), *g = fresh(1, 0, 0);
  int ok = coll__hier_propose(h, 16 * MIB) == 0 && coll__hier_propose(g, 16 * MIB) == 0;
  coll__hier_took(h, 16 * MIB, 0, 1.0);
  ok = ok && coll__hier_propose(h, 16 * MIB) == 0;
  record(ok, "proposer: only node 0's local rank 0", 1, 0, ok ? NULL : "another rank proposed");
  free(h), free(g);
}

static void test_fixed(void) {
  coll__hier_t *h = fresh(0, 0, 3);
  int ok = coll__hier_propose(h, MIB) == 3 && coll__hier_propose(h, 64 * MIB) == 3;
  record(ok, "fixed: HBMCOLL_PIPELINE_CHUNKS=3", 1, 0, ok ? NULL : "the count was not 3");
  free(h);
}

static void test_bad(void) {
  static const char *values[] = {"0", "x", "-2", "256", "1.5", " 3"};
  for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
    char text[256] = "", name[64];
    setenv("HBMCOLL_PIPELINE_CHUNKS", values[i], 1);
    int rc = coll_env_check(NULL, text, sizeof text);
    int ok = rc == COLL_EBADARG && strstr(text, "HBMCOLL_PIPELINE_CHUNKS") && strstr(text, "from 1 to 255");
    snprintf(name, sizeof name, "bad: HBMCOLL_PIPELINE_CHUNKS='%s'", values[i]);
    record(ok, name, 1, 0, ok ? NULL : text);
  }
  setenv("HBMCOLL_PIPELINE_CHUNKS", "255", 1);
  int ok = coll_env_check(NULL, NULL, 0) == 0;
  record(ok, "bad: 255 is taken", 1, 0, ok ? NULL : "refused");
  unsetenv("HBMCOLL_PIPELINE_CHUNKS");
}

int main(void) {
  test_turns();
  test_small();
  test_proposer();
  test_fixed();
  test_bad();
  return harness_finish();
}
