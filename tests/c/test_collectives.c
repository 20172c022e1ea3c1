/*
 * test_collectives.c - every collective over real processes (the one-collective machinery
 * is coll_ops.h's; arena buffers, requests and split have files of their own).
 *
 * Each case forks P ranks that build a communicator with a job key of their
 * own, run a sequence of collectives and check their own results (inputs are
 * derived from rank, block, element index and a per-call salt, so a stale or
 * misplaced chunk never passes); a rank exits non-zero on the first wrong
 * byte. The parent waits with a timeout and kills stragglers.
 *
 *  matrix     world sizes 1, 2, 3, 4, 5, 8 x every kind x counts {0, 1, 7,
 *             P*13+1, several slot chunks} x every root x out of place / in
 *             place / send == recv, reductions over a rotation of dtype x op,
 *             allreduce and reduce auto / flat / rsag; again with
 *             HBMCOLL_SLOT_BYTES=4096 (many chunks, many parity reuses); again
 *             with HBMCOLL_CMA=1 (large bcast and gather single copy, cma.c),
 *             =0 (staged only), auto (gather as its creation probe chose,
 *             cma_probe.c) and with single copy from the smallest non-eager size; again
 *             with the small collectives on the tree (algo_tree.c).
 *  random     the same pseudo-random sequence of collectives on every rank.
 *  many       65 ranks with 4 KiB slots.
 *
 * Prints one line per case and a last line "N passed, N failed"; exits 1 on
 * any failure. Runs under ASan/UBSan (tests/c/Makefile.inc).
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

#define HARNESS_KEY_PREFIX "hbct"
#define MAX_RANKS 128
#include "harness.h"
#include "coll_ops.h"

/* ---- the matrix --------------------------------------------------------------- */


/* arg: NULL, or the single-copy verdict the communicator must reach (its kinds) */
static int rank_matrix(int rank, int size, const char *key, void *arg) {
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  if (arg && size > 1 && coll_comm_single_copy(c) != *(const int *)arg) {
    fprintf(stderr, "rank %d: single copy %d, expected %d\n", rank, coll_comm_single_copy(c),
            *(const int *)arg);
    return 1;
  }
  size_t slot = env_slot_bytes();
  size_t counts_bytes_big = 3 * slot + 1000; /* 4 chunks of a slot; many more of a piece */
  unsigned salt = 0;
  int bad = 0;
  for (int k = 0; k < COLL_KIND_COUNT && bad < 2; k++) {
    coll_kind_t kind = (coll_kind_t)k;
    int nroots = kind_uses_root(kind) ? size : 1;
    int nmodes = (kind == COLL_GATHER || kind == COLL_SCATTER || kind == COLL_ALLGATHER) ? 3
                 : kind == COLL_BCAST || kind == COLL_BARRIER                           ? 1
                                                                                        : 2;
    for (int ci = 0; ci < 5 && bad < 2; ci++) {
      for (int root = 0; root < nroots && bad < 2; root++) {
        for (int mode = 0; mode < nmodes && bad < 2; mode++) {
          int ncases = kind_reduces(kind) && ci == 2 ? NRCASES : 1;
          for (int rci = 0; rci < ncases && bad < 2; rci++) {
            static const char *const algos[] = {NULL, "flat", "rsag"};
            int nalgos = kind == COLL_ALLREDUCE ? 3 : kind == COLL_REDUCE ? 2 : 1;
            for (int ai = 0; ai < nalgos && bad < 2; ai++) {
              op_t o;
              memset(&o, 0, sizeof o);
              o.kind = kind;
              o.root = root;
              o.mode = mode;
              o.salt = ++salt;
              o.rcase = ncases > 1 ? rci : (ci + root + mode + ai) % NRCASES;
              o.dtype = move_dtypes[(size_t)(ci + root + mode) % (sizeof move_dtypes / sizeof move_dtypes[0])];
              o.algo = kind == COLL_REDUCE ? algos[ai + 1] : algos[ai];
              size_t es = coll_dtype_size(kind_reduces(kind) ? rcases[o.rcase].dtype : o.dtype);
              size_t counts[5] = {0, 1, 7, (size_t)size * 13 + 1, counts_bytes_big / es + 1};
              o.count = counts[ci];
              int r = op_run(c, &o);
              if (r > bad) bad = r;
            }
          }
        }
      }
    }
  }
  if (getenv("TEST_VERBOSE") && rank == 0)
    fprintf(stderr, "matrix P=%d slot=%zu: %u collectives\n", size, slot, salt);
  coll_set_algorithm(c, COLL_ALLREDUCE, NULL);
  coll_set_algorithm(c, COLL_REDUCE, NULL);
  /* and a barrier last: nobody frees while a peer still reads */
  coll_args_t b = {.kind = COLL_BARRIER};
  if (bad < 2 && coll_run(c, &b) != 0) bad = 2;
  coll_comm_free(c);
  return bad;
}

/* ---- a random sequence ------------------------------------------------------------- */

/* The same pseudo-random sequence of collectives on every rank (kind, count,
 * root, mode, algorithm, arena, blocking or not), with rank-private random
 * pauses: every transition between kinds, readers and slot parities, with
 * ranks running ahead and falling behind. */
static uint64_t seq_next(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  return mix(*s);
}

static int rank_random(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  size_t slot = env_slot_bytes();
  const char *seed = getenv("TEST_SEED"); /* reproduce a run: TEST_SEED=n */
  uint64_t shared = 42 + (seed ? strtoull(seed, NULL, 10) : 0), mine = 1000 + (uint64_t)rank + shared * 131;
  int bad = 0;
  enum { NPEND = 3 };
  op_t pend[NPEND];
  coll_req_t *reqs[NPEND];
  int npend = 0;
  for (unsigned i = 0; i < 400 && bad < 2; i++) {
    op_t o;
    memset(&o, 0, sizeof o);
    o.kind = (coll_kind_t)(seq_next(&shared) % COLL_KIND_COUNT);
    o.root = (int)(seq_next(&shared) % (uint64_t)size);
    o.mode = (int)(seq_next(&shared) % 3);
    o.rcase = (int)(seq_next(&shared) % NRCASES);
    o.dtype = move_dtypes[seq_next(&shared) % 5];
    o.salt = 20000 + i;
    uint64_t pick = seq_next(&shared) % 8;
    size_t es = coll_dtype_size(kind_reduces(o.kind) ? rcases[o.rcase].dtype : o.dtype);
    o.count = pick < 2 ? (size_t)pick : pick < 6 ? (size_t)(seq_next(&shared) % 300) : (size_t)(seq_next(&shared) % (3 * slot / es));
    static const char *const algos[] = {NULL, "flat", "rsag"};
    o.algo = algos[seq_next(&shared) % 3];
    if (o.kind == COLL_REDUCE && o.algo == NULL) o.algo = "flat";
    o.arena = (o.kind == COLL_ALLREDUCE || o.kind == COLL_BCAST || o.kind == COLL_REDUCE) ? (int)(seq_next(&mine) % 4) : 0;
    int nonblocking = seq_next(&shared) % 3 == 0;
    if (seq_next(&mine) % 6 == 0) usleep((useconds_t)(seq_next(&mine) % 3000));
    if (nonblocking && o.kind != COLL_ALLREDUCE && o.kind != COLL_REDUCE) { /* algorithms are set per call */
      if (npend == NPEND) { /* retire the oldest */
        int r = req_finish(c, reqs[0], &pend[0], "random sequence");
        if (r > bad) bad = r;
        memmove(pend, pend + 1, sizeof pend[0] * (NPEND - 1));
        memmove(reqs, reqs + 1, sizeof reqs[0] * (NPEND - 1));
        npend--;
      }
      pend[npend] = o;
      op_prepare(c, &pend[npend]);
      int rc = coll_start(c, &pend[npend].a, &reqs[npend]);
      if (rc) {
        fprintf(stderr, "rank %d: coll_start: %s\n", rank, coll_err_name(rc));
        return 1;
      }
      npend++;
      continue;
    }
    if (npend && (o.kind == COLL_ALLREDUCE || o.kind == COLL_REDUCE)) { /* drain before changing the algorithm */
      for (int k = 0; k < npend; k++) {
        int r = req_finish(c, reqs[k], &pend[k], "random sequence");
        if (r > bad) bad = r;
      }
      npend = 0;
    }
    int r = op_run(c, &o);
    if (r > bad) bad = r;
  }
  for (int k = 0; k < npend; k++) {
    int r = req_finish(c, reqs[k], &pend[k], "random sequence");
    if (r > bad) bad = r;
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (bad < 2 && coll_run(c, &b) != 0) bad = 2;
  coll_comm_free(c);
  return bad;
}

/* ---- many ranks, small slots -------------------------------------------------------- */

/* alltoall, scatter and reduce_scatter split a slot into P pieces of whole
 * cache lines: with HBMCOLL_SLOT_BYTES=4096 and more than 64 ranks a piece
 * would be 0 bytes. */
static int rank_many(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0;
  unsigned salt = 300;
  static const coll_kind_t kinds[] = {COLL_ALLTOALL, COLL_SCATTER, COLL_REDUCE_SCATTER, COLL_ALLGATHER,
                                      COLL_ALLREDUCE};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !bad; i++)
    for (int ci = 0; ci < 2 && !bad; ci++) {
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = kinds[i];
      o.root = size - 1;
      o.dtype = COLL_INT32;
      o.rcase = 0;
      o.count = ci == 0 ? 3 : 40; /* 40 x 4 B x 65: more than a 4 KiB slot */
      o.salt = ++salt;
      bad = op_run(c, &o);
    }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
  const char *const small_slots[] = {"HBMCOLL_SLOT_BYTES=4096", NULL};
  const char *const push_always[] = {"HBMCOLL_STREAM_MIN=0", "HBMCOLL_PUSH_MIN=0",
                                         "HBMCOLL_PUSH_STREAM_MIN=0", NULL};
  const char *const rep_movsb_always[] = {"HBMCOLL_REP_MOVSB_MIN=0", NULL};
  const char *const single_copy[] = {"HBMCOLL_CMA=1", NULL};
  const char *const staged_only[] = {"HBMCOLL_CMA=0", NULL};
  const char *const staged_streamed[] = {"HBMCOLL_STAGE_STREAM_MIN=0", NULL};
  const char *const staged_ordinary[] = {"HBMCOLL_STAGE_STREAM_MIN=off", NULL};
  const char *const all_single_copy[] = {"HBMCOLL_CMA=1", "HBMCOLL_SLOT_BYTES=4096", "HBMCOLL_CMA_MIN=1", NULL};
  const char *const trees[] = {"HBMCOLL_ALGO=barrier=tree,bcast=tree,gather=tree,reduce=tree,allreduce=tree", NULL};
  const char *const gather_single_copy[] = {"HBMCOLL_CMA=gather", NULL};
  static const int yes = (1 << COLL_BCAST) | (1 << COLL_GATHER), no = 0, gather = 1 << COLL_GATHER;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int P = sizes[i];
    if (CASE("matrix slot=4096")) spawn("matrix slot=4096", P, 600, small_slots, rank_matrix, NULL);
    if (CASE("matrix staged only")) spawn("matrix staged only", P, 600, staged_only, rank_matrix, (void *)&no);
    if (P <= 3 && CASE("matrix single copy as measured (HBMCOLL_CMA=auto)"))
      spawn("matrix single copy as measured (HBMCOLL_CMA=auto)", P, 600, NULL, rank_matrix, NULL);
    if ((P == 2 || P == 5) && CASE("matrix single copy (HBMCOLL_CMA=1)"))
      spawn("matrix single copy (HBMCOLL_CMA=1)", P, 600, single_copy, rank_matrix, (void *)&yes);
    if ((P == 2 || P == 3) && CASE("matrix single copy, gather only"))
      spawn("matrix single copy, gather only", P, 600, gather_single_copy, rank_matrix, (void *)&gather);
    if ((P == 2 || P == 3 || P == 8) && CASE("matrix single copy from 1 B, slot=4096"))
      spawn("matrix single copy from 1 B, slot=4096", P, 600, all_single_copy, rank_matrix, (void *)&yes);
    if ((P == 2 || P == 3) && CASE("matrix streaming stores from 0 B"))
      spawn("matrix streaming stores from 0 B", P, 600, push_always, rank_matrix, NULL);
    if ((P == 2 || P == 3 || P == 5) && CASE("matrix staged with streaming stores from 0 B"))
      spawn("matrix staged with streaming stores from 0 B", P, 600, staged_streamed, rank_matrix, NULL);
    if ((P == 2 || P == 3) && CASE("matrix staged with ordinary stores"))
      spawn("matrix staged with ordinary stores", P, 600, staged_ordinary, rank_matrix, NULL);
    if ((P == 2 || P == 3) && CASE("matrix rep movsb from 0 B"))
      spawn("matrix rep movsb from 0 B", P, 600, rep_movsb_always, rank_matrix, NULL);
    if ((P == 3 || P == 5) && CASE("matrix on the tree"))
      spawn("matrix on the tree", P, 600, trees, rank_matrix, NULL);
    if (CASE("random sequence")) spawn("random sequence", P, 300, NULL, rank_random, NULL);
    if (CASE("random sequence slot=4096")) spawn("random sequence slot=4096", P, 300, small_slots, rank_random, NULL);
    if (P >= 3 && CASE("random sequence on the tree")) spawn("random sequence on the tree", P, 300, trees, rank_random, NULL);
  }
  if (CASE("many ranks, slot=4096")) spawn("many ranks, slot=4096", 65, 600, small_slots, rank_many, NULL);
  return harness_finish();
}
