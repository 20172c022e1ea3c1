/*
 * test_vcoll.c - coll_run_v (vcoll.c): every v-collective with blocks of different sizes (0
 * among them), equal sizes (the fixed-size path), counts gathered from the ranks, results made by
 * alloc; then disagreements, which every rank must return alike with the communicator going on.
 * Every rank derives what every rank sends from the ranks' numbers and checks every element.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbcv"
#define MAX_RANKS 16
#include "harness.h"
#include "coll_ops.h"

static size_t count_of(int k) { return (size_t)((3 * k + 1) % 5 * (k + 1)); } /* 1, 8, 6, 0, 15 */
static int32_t value(int k, size_t i) { return (int32_t)(1000 * k + (int)i); }
static size_t sends_to(int r, int j) { return (size_t)((r + j) % 4); } /* alltoallv: r's block for j */

static void *alloc_plain(void *arg, size_t bytes) {
  *(void **)arg = malloc(bytes ? bytes : 1);
  return *(void **)arg;
}
static void *alloc_none(void *arg, size_t bytes) { (void)arg, (void)bytes; return NULL; }

/* The blocks of every rank end to end, and the total. */
static int32_t *every_block(int P, const size_t *n, size_t *total_p) {
  size_t total = 0;
  for (int k = 0; k < P; k++) total += n[k];
  int32_t *all = malloc((total + 1) * sizeof *all), *at = all;
  for (int k = 0; k < P; k++)
    for (size_t i = 0; i < n[k]; i++) *at++ = value(k, i);
  *total_p = total;
  return all;
}

static int check(const int32_t *got, const int32_t *want, size_t n, const char *what, int rank) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "rank %d: %s: element %zu is %d, want %d\n", rank, what, i, got[i], want[i]);
      return 1;
    }
  return 0;
}

static int rank_shapes(int rank, int P, const char *key, void *arg) {
  int uniform = arg != NULL;
  coll_comm_t *c;
  if (comm_open(rank, P, key, 30, &c)) return 1;
  size_t n[64], total;
  for (int k = 0; k < P; k++) n[k] = uniform ? 5 : count_of(k);
  int32_t *all = every_block(P, n, &total), *mine = malloc((n[rank] + 1) * sizeof *mine);
  int32_t *out = malloc((total + 1) * sizeof *out);
  for (size_t i = 0; i < n[rank]; i++) mine[i] = value(rank, i);
  int bad = 0, rc;
  coll_vargs_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .counts = n, .send = mine, .send_count = n[rank],
                    .recv = out, .recv_count = total};
  EXPECT((rc = coll_run_v(c, &a)) == 0, "allgatherv: %s", coll_err_name(rc));
  bad |= check(out, all, total, "allgatherv", rank);

  void *made = NULL; /* counts from the ranks, the result made by alloc */
  coll_vargs_t g = {.kind = COLL_GATHER, .dtype = COLL_INT32, .root = P - 1, .send = mine, .send_count = n[rank],
                    .alloc = alloc_plain, .alloc_arg = &made};
  EXPECT((rc = coll_run_v(c, &g)) == 0, "gatherv: %s", coll_err_name(rc));
  EXPECT((made != NULL) == (rank == P - 1 && total > 0), "gatherv: made a result off the root, or none on it");
  if (made) bad |= check(made, all, total, "gatherv", rank);
  free(made);

  memset(out, 0, (total + 1) * sizeof *out);
  coll_vargs_t s = {.kind = COLL_SCATTER, .dtype = COLL_INT32, .root = 0, .counts = n, .send = rank == 0 ? all : NULL,
                    .send_count = rank == 0 ? total : 0, .recv = out, .recv_count = n[rank]};
  EXPECT((rc = coll_run_v(c, &s)) == 0, "scatterv: %s", coll_err_name(rc));
  bad |= check(out, mine, n[rank], "scatterv", rank);

  int32_t *ramp = malloc((total + 1) * sizeof *ramp), *want = malloc((total + 1) * sizeof *want);
  for (size_t i = 0; i < total; i++) ramp[i] = (int32_t)i, want[i] = (int32_t)(P * i);
  size_t at = 0;
  for (int k = 0; k < rank; k++) at += n[k];
  coll_vargs_t r = {.kind = COLL_REDUCE_SCATTER, .dtype = COLL_INT32, .op = COLL_SUM, .counts = n, .send = ramp,
                    .send_count = total, .recv = out, .recv_count = n[rank]};
  EXPECT((rc = coll_run_v(c, &r)) == 0, "reduce_scatterv: %s", coll_err_name(rc));
  bad |= check(out, want + at, n[rank], "reduce_scatterv", rank);

  size_t row[64], sent = 0, got = 0; /* alltoallv: rank r sends rank j sends_to(r, j) of value(10r + j, i) */
  for (int j = 0; j < P; j++) row[j] = uniform ? 3 : sends_to(rank, j), sent += row[j];
  int32_t *send = malloc((sent + 1) * sizeof *send), *to = send;
  for (int j = 0; j < P; j++)
    for (size_t i = 0; i < row[j]; i++) *to++ = value(10 * rank + j, i);
  int32_t *came = malloc((4 * (size_t)P + 1) * sizeof *came), *from = came;
  for (int k = 0; k < P; k++)
    for (size_t i = 0; i < (uniform ? 3 : sends_to(k, rank)); i++) *from++ = value(10 * k + rank, i), got++;
  made = NULL;
  coll_vargs_t x = {.kind = COLL_ALLTOALL, .dtype = COLL_INT32, .counts = row, .send = send, .send_count = sent,
                    .alloc = alloc_plain, .alloc_arg = &made};
  EXPECT((rc = coll_run_v(c, &x)) == 0, "alltoallv: %s", coll_err_name(rc));
  if (made) bad |= check(made, came, got, "alltoallv", rank);
  EXPECT(made != NULL || got == 0, "alltoallv: no result made");
  free(made), free(send), free(came), free(ramp), free(want), free(out), free(mine), free(all);
  coll_comm_free(c);
  return bad;
}

/* Disagreements: every rank gets COLL_EMISMATCH and the same sentence, and goes on. */
static int rank_disagree(int rank, int P, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, P, key, 30, &c)) return 1;
  int bad = 0, rc;
  size_t n[8] = {2, 2, 2, 2, 2, 2, 2, 2}, other[8] = {2, 2, 2, 2, 2, 2, 2, 2}, huge[8] = {2, 2, 2, 2, 2, 2, 2, 2};
  other[0] = 3, huge[0] = SIZE_MAX; /* huge: wraps the sum round to 2 * P + 1 */
  int32_t mine[4] = {rank, rank, rank, rank}, out[32];
  const char *text = NULL;
  struct { const char *says; coll_vargs_t a; } cases[] = {
      {"different counts", {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .counts = rank == 1 ? other : n, .send = mine,
                            .send_count = 2, .recv = out, .recv_count = 2 * (size_t)P}},
      {"sends 3 elements", {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .counts = n, .send = mine,
                            .send_count = rank == P - 1 ? 3 : 2, .recv = out, .recv_count = 2 * (size_t)P}},
      {"gave int32", {.kind = COLL_GATHER, .dtype = rank == 1 ? COLL_FLOAT32 : COLL_INT32, .send = mine, .send_count = 1,
                      .recv = out, .recv_count = (size_t)P}},
      {"different ops or roots", {.kind = COLL_GATHER, .dtype = COLL_INT32, .root = rank, .send = mine, .send_count = 1,
                                  .recv = out, .recv_count = (size_t)P}},
      {"receive buffer holds", {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .send = mine, .send_count = 1, .recv = out,
                                .recv_count = rank == 1 ? 1 : (size_t)P}},
      {"no receive buffer", {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .send = mine, .send_count = 1,
                             .recv = rank == 1 ? NULL : out, .recv_count = (size_t)P}},
      {"more than a buffer can hold", {.kind = COLL_REDUCE_SCATTER, .dtype = COLL_INT32, .counts = huge, .send = mine,
                                       .send_count = 2 * (size_t)P + 1, .recv = out, .recv_count = 2}},
      {"different collective", {.kind = rank == 1 ? COLL_ALLTOALL : COLL_GATHER, .dtype = COLL_INT32, .counts = n,
                                .send = mine, .send_count = rank == 1 ? 2 * (size_t)P : 2, .recv = out, .recv_count = 2 * (size_t)P}},
      {"wrong arguments", {.kind = COLL_SCATTER, .dtype = COLL_INT32, .counts = rank == P - 1 ? NULL : n,
                           .send = mine, .send_count = 2 * (size_t)P, .recv = out, .recv_count = 2}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    rc = coll_run_v(c, &cases[k].a);
    EXPECT(rc == COLL_EMISMATCH, "case %zu: %s, want EMISMATCH", k, coll_err_name(rc));
    EXPECT(coll_comm_error(c, &text) == 0 && strstr(text, cases[k].says), "case %zu: the sentence is \"%s\"", k, text);
  }
  coll_args_t wrong = {.kind = COLL_KIND_COUNT}; /* a later refusal does not carry the last sentence */
  EXPECT(coll_run(c, &wrong) == COLL_EBADARG && coll_comm_error(c, &text) == 0 && text[0] == 0,
         "a bad call after a disagreement says \"%s\"", text);
  void *made = NULL; /* one rank's alloc fails: it alone says so, the others get their result */
  coll_vargs_t g = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .send = mine, .send_count = 4,
                    .alloc = rank == 0 ? alloc_none : alloc_plain, .alloc_arg = &made};
  rc = coll_run_v(c, &g);
  EXPECT(rc == (rank == 0 ? COLL_EBADARG : 0), "alloc: %s", coll_err_name(rc));
  if (made) EXPECT(((int32_t *)made)[4 * (P - 1)] == P - 1, "alloc: the last block is wrong");
  free(made);
  int32_t one = 1, sum = 0; /* and the communicator goes on */
  coll_args_t s = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &one, .recv = &sum};
  EXPECT((rc = coll_run(c, &s)) == 0 && sum == P, "allreduce after: %s, sum %d", coll_err_name(rc), sum);
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    if (CASE("shapes")) spawn("shapes", sizes[i], 120, NULL, rank_shapes, NULL);
    if (CASE("uniform")) spawn("uniform", sizes[i], 120, NULL, rank_shapes, (void *)1);
    if (sizes[i] > 1 && CASE("disagree")) spawn("disagree", sizes[i], 120, NULL, rank_disagree, NULL);
  }
  return harness_finish();
}
