/*
 * test_nodes_ride.c - calls whose data rides in the meeting between two nodes of one rank each
 * (hier.c, hier_ride: up to COLL__HIER_RIDE_2 bytes with the descriptor, one transfer each way):
 * two emulated nodes (network namespaces, tests/c/netns.h) of one rank, joined from C as
 * hbmcoll-run would (tests/c/nodes_job.h).
 *
 *  - allreduce, reduce, bcast (roots on both nodes), allgather and gather (also in place, and with
 *    the input overlapping another rank's place of the result), and scatter,
 *    float32 and int8, at counts that ride (the largest: exactly 64 KiB) and just past it: every
 *    value checked, and coll_comm_algorithm says "meeting" exactly where the bytes ride;
 *  - 3000 calls back to back, sizes changing every call (8 B, 1 KiB, 64 KiB, past it), one rank
 *    sleeping now and then so that the other runs a call ahead into the other area: every result;
 *  - disagreements where one rank's call rides and the other's does not (64 KiB against 4 more
 *    bytes), or the same bytes in another collective or another root: COLL_EMISMATCH on both
 *    ranks with a sentence, and the next call succeeds.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbnr"
#define NODES 2
#define PER 1
#define SIZE (NODES * PER)
#define HARNESS_NAME_WIDTH 48
#include "harness.h"
#include "netns.h"
#include "nodes_job.h"

#define RIDE 65536 /* COLL__HIER_RIDE_2, with the default pool */

/* Element i of rank r's input in call c, small enough that sums of two fit int8. */
static int val(int r, size_t i, unsigned c) { return (int)((r * 7 + i * 3 + c * 5) % 61) - 30; }

static double at(coll_dtype_t t, const void *b, size_t i) {
  return t == COLL_INT8 ? ((const int8_t *)b)[i] : ((const float *)b)[i];
}
static void put(coll_dtype_t t, void *b, size_t i, int v) {
  if (t == COLL_INT8) ((int8_t *)b)[i] = (int8_t)v;
  else ((float *)b)[i] = (float)v;
}

/* One call of kind on count elements of t (per rank for the gathers), checked; 0 or 1. */
static int call(coll_comm_t *c, int rank, coll_kind_t kind, coll_dtype_t t, size_t count, int root, unsigned n,
                int in_place, int want_meeting) {
  size_t es = coll_dtype_size(t), all = count * SIZE;
  uint8_t *send = malloc(all * es + 1), *recv = malloc(all * es + 1);
  for (size_t i = 0; i < all; i++) put(t, send, i, val(rank, i, n)), put(t, recv, i, -99);
  if (kind == COLL_BCAST && rank == root)
    for (size_t i = 0; i < count; i++) put(t, recv, i, val(rank, i, n));
  coll_args_t a = {.kind = kind, .dtype = t, .op = COLL_SUM, .root = root, .count = count, .send = send, .recv = recv};
  if (in_place) { /* my block already in its place of the result (1), or at its start (2: overlapping
                   * rank 0's place, which an allgather may be given too) */
    size_t at = in_place == 1 ? (size_t)rank * count : 0;
    for (size_t i = 0; i < count; i++) put(t, recv, at + i, val(rank, i, n));
    a.send = recv + at * es;
  }
  int rc = coll_run(c, &a), bad = 0;
  const char *text = "";
  if (rc) coll_comm_error(c, &text), bad = 1;
  if (rc) fprintf(stderr, "rank %d: %s x %zu: %s (%s)\n", rank, coll_kind_name(kind), count, coll_err_name(rc), text);
  int meeting = strcmp(coll_comm_algorithm(c), "meeting") == 0;
  if (!bad && want_meeting >= 0 && meeting != want_meeting)
    fprintf(stderr, "rank %d: %s x %zu took %s\n", rank, coll_kind_name(kind), count, coll_comm_algorithm(c)), bad = 1;
  for (size_t i = 0; i < all && !bad; i++) {
    size_t b = i / (count ? count : 1), j = i % (count ? count : 1);
    double want = -99; /* untouched */
    if ((kind == COLL_REDUCE || kind == COLL_GATHER) && rank != root) continue; /* undefined there */
    if ((kind == COLL_ALLREDUCE || kind == COLL_REDUCE) && i < count) want = val(0, i, n) + val(1, i, n);
    else if (kind == COLL_BCAST && i < count) want = val(root, i, n);
    else if (kind == COLL_ALLGATHER || kind == COLL_GATHER) want = val((int)b, j, n);
    else if (kind == COLL_SCATTER && i < count) want = val(root, (size_t)rank * count + i, n);
    if (at(t, recv, i) != want) {
      fprintf(stderr, "rank %d: %s %s x %zu root %d call %u: [%zu] = %g, want %g\n", rank, coll_kind_name(kind),
              coll_dtype_name(t), count, root, n, i, at(t, recv, i), want);
      bad = 1;
    }
  }
  free(send), free(recv);
  return bad;
}

static int job_kinds(coll_comm_t *c, int rank) {
  static const coll_kind_t kinds[] = {COLL_ALLREDUCE, COLL_REDUCE, COLL_BCAST, COLL_ALLGATHER, COLL_GATHER, COLL_SCATTER};
  int bad = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
    for (int t = 0; t < 2; t++) {
      coll_dtype_t dt = t ? COLL_INT8 : COLL_FLOAT32;
      size_t es = coll_dtype_size(dt), counts[] = {1, 256 / es, RIDE / es, RIDE / es + 1};
      /* scatter is a bcast of all the root's blocks: it rides where they all fit */
      for (size_t ci = 0; ci < 4; ci++)
        for (int root = 0; root < SIZE; root++) {
          size_t bytes = counts[ci] * es * (kinds[k] == COLL_SCATTER ? SIZE : 1);
          int rooted = kinds[k] != COLL_ALLREDUCE && kinds[k] != COLL_ALLGATHER;
          int rides = bytes <= RIDE && kinds[k] != COLL_SCATTER; /* (scatter names its bcast "meeting" too) */
          if (!rooted && root) continue;
          bad += call(c, rank, kinds[k], dt, counts[ci], root, (unsigned)(k * 8 + ci), 0,
                      kinds[k] == COLL_SCATTER ? -1 : rides);
          if (kinds[k] == COLL_ALLGATHER || kinds[k] == COLL_GATHER)
            for (int overlap = 1; overlap <= 2; overlap++)
              bad += call(c, rank, kinds[k], dt, counts[ci], root, (unsigned)ci, overlap, rides);
          if (bad) return bad;
        }
    }
  return bad;
}

static int job_back_to_back(coll_comm_t *c, int rank) {
  static const size_t bytes[] = {8, 1024, RIDE, RIDE + 4, 64};
  unsigned seed = 99u + (unsigned)rank;
  int bad = 0;
  for (unsigned n = 0; n < 3000 && !bad; n++) {
    if (rank == 1 && rand_r(&seed) % 8 == 0) usleep((useconds_t)(rand_r(&seed) % 400));
    size_t count = bytes[n % 5] / 4;
    bad += call(c, rank, n % 3 ? COLL_ALLREDUCE : COLL_ALLGATHER, COLL_FLOAT32, count, 0, n, 0, bytes[n % 5] <= RIDE);
  }
  return bad;
}

/* rank 1's call differs from rank 0's as case `how` says; both must see the disagreement. */
static int disagree(coll_comm_t *c, int rank, int how) {
  static float in[RIDE / 4 + 16], out[2 * (RIDE / 4 + 16)];
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = RIDE / 4, .send = in, .recv = out};
  if (rank == 1 && how == 0) a.count = RIDE / 4 + 1;           /* rides on rank 0, not on rank 1 */
  if (rank == 1 && how == 1) a.kind = COLL_ALLGATHER;           /* the same bytes in another collective */
  if (how == 2) a.kind = COLL_BCAST, a.root = rank;             /* each its own root */
  if (rank == 1 && how == 3) a.dtype = COLL_INT32;              /* the same bytes of another dtype */
  int rc = coll_run(c, &a);
  const char *text = "";
  coll_comm_error(c, &text);
  if (rc != COLL_EMISMATCH || !strstr(text, "disagree"))
    return fprintf(stderr, "rank %d: disagreement %d gave %s (%s)\n", rank, how, coll_err_name(rc), text), 1;
  return call(c, rank, COLL_ALLREDUCE, COLL_FLOAT32, RIDE / 4, 0, (unsigned)how, 0, 1);
}

static int job_mismatch(coll_comm_t *c, int rank) {
  int bad = 0;
  for (int how = 0; how < 4 && !bad; how++) bad += disagree(c, rank, how);
  return bad;
}

int main(void) {
  const scenario_t all[] = {
      {"2 x 1: every kind rides up to 64 KiB, not past", job_kinds, -1, 0},
      {"2 x 1: 3000 calls, sizes changing, one rank late", job_back_to_back, -1, 0},
      {"2 x 1: a disagreement about riding is EMISMATCH", job_mismatch, -1, 0},
  };
  return scenarios_run(all, sizeof all / sizeof all[0], "calls riding in the meeting", 35000);
}
