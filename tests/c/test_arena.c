/*
 * test_arena.c - collectives on buffers in the shared arena (coll_arena_alloc,
 * hbmcoll.empty): allreduce flat and rsag with buffers in the arena on all, none or some
 * ranks, in place and not; bcast from an arena root; reduce from an arena root followed by a
 * collective on another communicator. Forked ranks check every byte (coll_ops.h).
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

#define HARNESS_KEY_PREFIX "hbca"
#define MAX_RANKS 128
#include "harness.h"
#include "coll_ops.h"

/* ---- arena buffers ---------------------------------------------------------- */

/* who: 0 none, 1 all, 2 even ranks, 3 rank 0 only */
static int arena_pick(int who, int rank) {
  return who == 1 || (who == 2 && rank % 2 == 0) || (who == 3 && rank == 0);
}

static int rank_arena(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  size_t slot = env_slot_bytes();
  unsigned salt = 1000;
  int bad = 0;
  /* allreduce: flat / rsag x in place or not x arena on all / none / some ranks,
   * and arena on send only / recv only / both */
  static const char *const algos[] = {"flat", "rsag"};
  for (int ai = 0; ai < 2 && !bad; ai++)
    for (int ci = 0; ci < 5 && !bad; ci++)
      for (int mode = 0; mode < 2 && !bad; mode++)
        for (int who = 0; who < 4 && !bad; who++)
          for (int where = 1; where <= 3 && !bad; where++) {
            if (mode == MODE_IN && where != 3) continue;
            op_t o;
            memset(&o, 0, sizeof o);
            o.kind = COLL_ALLREDUCE;
            o.mode = mode;
            o.algo = algos[ai];
            o.salt = ++salt;
            o.rcase = (ci + who + where) % NRCASES;
            size_t es = coll_dtype_size(rcases[o.rcase].dtype);
            size_t counts[5] = {0, 1, 7, (size_t)size * 13 + 1, (3 * slot + 1000) / es + 1};
            o.count = counts[ci];
            o.arena = arena_pick(who, rank) ? where : 0;
            bad = op_run(c, &o);
          }
  coll_set_algorithm(c, COLL_ALLREDUCE, NULL);
  /* reduce with arena inputs on some ranks (flat reads them in place) */
  for (int root = 0; root < size && !bad; root++)
    for (int who = 0; who < 4 && !bad; who++)
      for (int ci = 0; ci < 3 && !bad; ci++) {
        op_t o;
        memset(&o, 0, sizeof o);
        o.kind = COLL_REDUCE;
        o.mode = MODE_OUT;
        o.algo = "flat";
        o.root = root;
        o.salt = ++salt;
        o.rcase = (root + who) % NRCASES;
        size_t counts[3] = {1, 7, (size_t)size * 13 + 1};
        o.count = counts[ci];
        o.arena = arena_pick(who, rank) ? AR_SEND : 0;
        bad = op_run(c, &o);
      }
  coll_set_algorithm(c, COLL_REDUCE, NULL);
  /* gather into an arena output on the root (others push the chunks after the
   * first straight into it), in place or not, send in the arena or not */
  for (int root = 0; root < size && !bad; root++)
    for (int mode = 0; mode < 3 && !bad; mode++)
      for (int ci = 0; ci < 3 && !bad; ci++) {
        op_t o;
        memset(&o, 0, sizeof o);
        o.kind = COLL_GATHER;
        o.mode = mode;
        o.root = root;
        o.dtype = move_dtypes[(root + ci) % 5];
        o.salt = ++salt;
        size_t counts[3] = {7, (size_t)size * 13 + 1, (3 * slot + 1000) / coll_dtype_size(o.dtype) + 1};
        o.count = counts[ci];
        o.arena = rank == root ? AR_RECV | (ci % 2 ? AR_SEND : 0) : (ci + rank) % 2 ? AR_SEND : 0;
        bad = op_run(c, &o);
      }
  /* bcast from an arena root (and arena receivers), every root, several counts */
  for (int root = 0; root < size && !bad; root++)
    for (int ci = 0; ci < 4 && !bad; ci++) {
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = COLL_BCAST;
      o.root = root;
      o.dtype = COLL_UINT8;
      o.salt = ++salt;
      size_t counts[4] = {0, 7, (size_t)size * 13 + 1, 3 * slot + 1000};
      o.count = counts[ci];
      o.arena = rank == root || ci % 2 ? AR_RECV : 0;
      bad = op_run(c, &o);
    }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

/* A reduce whose root reads its own input from the arena, then a collective on
 * another communicator. Nobody but the root reads the root's input, so the
 * root must not wait for the others after the reduce: they are already in the
 * next collective (on `sub`), which needs the root. */
static int rank_arena_reduce_then_other(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c, *sub = NULL;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0, rc;
  if ((rc = coll_comm_split(c, 0, 0, &sub)) != 0) {
    fprintf(stderr, "rank %d: split: %s\n", rank, coll_err_name(rc));
    coll_comm_free(c);
    return 1;
  }
  for (int root = 0; root < size && !bad; root++) {
    op_t o;
    memset(&o, 0, sizeof o);
    o.kind = COLL_REDUCE;
    o.mode = MODE_OUT;
    o.root = root;
    o.algo = "flat";
    o.salt = 77 + (unsigned)root;
    o.rcase = 0;
    o.count = 7;
    o.arena = rank == root ? AR_SEND : 0;
    bad = op_run(c, &o);
    coll_args_t b = {.kind = COLL_BARRIER};
    if (!bad && (rc = coll_run(sub, &b)) != 0) {
      fprintf(stderr, "rank %d: barrier on the sub-communicator after reduce(root %d): %s\n", rank, root,
              coll_err_name(rc));
      bad = 1;
    }
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(sub);
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
  const char *const small_slots[] = {"HBMCOLL_SLOT_BYTES=4096", NULL};
  const char *const timeout10[] = {"HBMCOLL_TIMEOUT=10", NULL};
  const char *const push_always[] = {"HBMCOLL_STREAM_MIN=0", "HBMCOLL_PUSH_MIN=0",
                                         "HBMCOLL_PUSH_STREAM_MIN=0", NULL};
  const char *const rep_movsb_always[] = {"HBMCOLL_REP_MOVSB_MIN=0", NULL};
  const char *const push_plain[] = {"HBMCOLL_PUSH_MIN=0", NULL}; /* ordinary stores */
  const char *const push_never[] = {"HBMCOLL_PUSH_MIN=1G", NULL};  /* rsag's zero copy (the default pushes) */
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int P = sizes[i];
    if (CASE("arena")) spawn("arena", P, 600, NULL, rank_arena, NULL);
    if (CASE("arena rep movsb from 0 B")) spawn("arena rep movsb from 0 B", P, 600, rep_movsb_always, rank_arena, NULL);
    if (CASE("arena slot=4096")) spawn("arena slot=4096", P, 600, small_slots, rank_arena, NULL);
    if (CASE("arena streaming stores from 0 B"))
      spawn("arena streaming stores from 0 B", P, 600, push_always, rank_arena, NULL);
    if (CASE("arena push from 0 B"))
      spawn("arena push from 0 B", P, 600, push_plain, rank_arena, NULL);
    if (CASE("arena rsag, no push"))
      spawn("arena rsag, no push", P, 600, push_never, rank_arena, NULL);
    if (P > 1 && CASE("arena reduce then other comm"))
      spawn("arena reduce then other comm", P, 60, timeout10, rank_arena_reduce_then_other, NULL);
  }
  return harness_finish();
}
