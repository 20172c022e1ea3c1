/*
 * test_split.c - coll_comm_split with several colors and keys (and color -1), collectives
 * on parent and children interleaved, nested splits. Forked ranks check every byte
 * (coll_ops.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbcs"
#define MAX_RANKS 128
#include "harness.h"
#include "coll_ops.h"

/* ---- split ------------------------------------------------------------------------ */

static int check_members(coll_comm_t *sub, const int32_t *expect_old, int n, const char *what) {
  /* allgather the old ranks: must come out in the expected order */
  int32_t mine[2] = {expect_old[coll_comm_rank(sub)], 0};
  int32_t *all = calloc((size_t)n * 2, sizeof *all);
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 2, .send = mine, .recv = all};
  int rc = coll_run(sub, &a), bad = 0;
  if (rc) fprintf(stderr, "%s: allgather: %s\n", what, coll_err_name(rc)), bad = 1;
  for (int i = 0; i < n && !bad; i++)
    if (all[2 * i] != expect_old[i]) fprintf(stderr, "%s: member %d is old rank %d, want %d\n", what, i, all[2 * i], expect_old[i]), bad = 1;
  free(all);
  return bad;
}

static int rank_split(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0, rc;
  unsigned salt = 9000;
  for (int round = 0; round < 3 && !bad; round++) {
    /* A: color rank % 2, key -rank: members in decreasing old rank */
    /* B: color rank % 3, but rank % 3 == 2 joins none; key = 0: by old rank */
    coll_comm_t *a = NULL, *b = NULL, *nested = NULL;
    int ca = rank % 2, cb = rank % 3 == 2 ? -1 : rank % 3;
    /* a request on the parent stays in flight across the splits */
    op_t pending;
    memset(&pending, 0, sizeof pending);
    pending.kind = COLL_ALLREDUCE;
    pending.salt = ++salt;
    pending.count = 5000 + (size_t)round;
    pending.rcase = round;
    op_prepare(c, &pending);
    coll_req_t *req;
    if ((rc = coll_start(c, &pending.a, &req)) != 0) return 1;
    if ((rc = coll_comm_split(c, ca, -rank, &a)) != 0) {
      fprintf(stderr, "rank %d: split A: %s\n", rank, coll_err_name(rc));
      return 1;
    }
    if ((rc = coll_comm_split(c, cb, 0, &b)) != 0) {
      fprintf(stderr, "rank %d: split B: %s\n", rank, coll_err_name(rc));
      return 1;
    }
    if ((cb < 0) != (b == NULL)) fprintf(stderr, "rank %d: color -1 must give NULL\n", rank), bad = 1;
    int32_t expa[MAX_RANKS], expb[MAX_RANKS];
    int na = 0, nb = 0;
    for (int r = size - 1; r >= 0; r--)
      if (r % 2 == ca) expa[na++] = r;
    for (int r = 0; r < size; r++)
      if (cb >= 0 && r % 3 == cb) expb[nb++] = r;
    if (coll_comm_size(a) != na || expa[coll_comm_rank(a)] != rank)
      fprintf(stderr, "rank %d: split A gave rank %d of %d\n", rank, coll_comm_rank(a), coll_comm_size(a)), bad = 1;
    if (b && (coll_comm_size(b) != nb || expb[coll_comm_rank(b)] != rank))
      fprintf(stderr, "rank %d: split B gave rank %d of %d\n", rank, coll_comm_rank(b), coll_comm_size(b)), bad = 1;
    if (bad) return 1;
    /* interleave: parent, A, B, parent, A ... */
    bad |= check_members(a, expa, na, "split A");
    if (b) bad |= check_members(b, expb, nb, "split B");
    for (int i = 0; i < 4 && !bad; i++) {
      op_t o;
      memset(&o, 0, sizeof o);
      static const coll_kind_t ks[4] = {COLL_ALLREDUCE, COLL_BCAST, COLL_ALLTOALL, COLL_REDUCE};
      o.kind = ks[i];
      o.count = 3 + (size_t)i * 50;
      o.dtype = COLL_INT32;
      o.rcase = i;
      o.salt = ++salt;
      o.root = 0;
      bad |= op_run(a, &o);
      o.salt = ++salt; /* the same on every rank, in b or not */
      if (b) bad |= op_run(b, &o);
      o.salt = ++salt;
      o.root = i % size;
      bad |= op_run(c, &o);
    }
    bad |= req_finish(c, req, &pending, "allreduce in flight across splits");
    /* nested: split A by (old rank / 2) % 2 */
    if (!bad) {
      int cn = (rank / 2) % 2;
      if ((rc = coll_comm_split(a, cn, rank, &nested)) != 0) {
        fprintf(stderr, "rank %d: nested split: %s\n", rank, coll_err_name(rc));
        return 1;
      }
      int32_t expn[MAX_RANKS];
      int nn = 0;
      for (int r = 0; r < size; r++)
        if (r % 2 == ca && (r / 2) % 2 == cn) expn[nn++] = r;
      bad |= check_members(nested, expn, nn, "nested split");
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = COLL_ALLREDUCE;
      o.count = 33;
      o.salt = ++salt;
      bad |= op_run(nested, &o);
    }
    coll_args_t bar = {.kind = COLL_BARRIER};
    if (!bad && nested && coll_run(nested, &bar) != 0) bad = 1;
    if (!bad && b && coll_run(b, &bar) != 0) bad = 1;
    if (!bad && coll_run(a, &bar) != 0) bad = 1;
    coll_comm_free(nested);
    coll_comm_free(b);
    coll_comm_free(a);
  }
  coll_args_t bar = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &bar) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (CASE("split")) spawn("split", sizes[i], 300, NULL, rank_split, NULL);
  return harness_finish();
}
