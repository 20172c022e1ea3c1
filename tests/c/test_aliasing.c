/*
 * test_aliasing.c - send and recv that partly overlap (aliasing.c).
 *
 * Each rank lays send and recv in one allocation, recv = send + shift, for
 * shifts of a few elements, of more than a staging slot and of half the
 * message, in private memory and in the arena, and checks the result against
 * what separate buffers give. Slots are 4 KiB so every message takes many
 * pipelined rounds (an unprotected run overwrites input it has not read yet).
 * Under ASan this also checks the private copy is freed and never overrun.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HARNESS_KEY_PREFIX "hbal"
#include "harness.h"

/* Under ASan, malloc must be allowed to say no (rank_no_memory), as it does without. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

enum { N = 5000 }; /* int32 elements per block: about 5 slots of 4 KiB */

static int32_t val(int rank, size_t i) { return (int32_t)(i * 7 + 1000 * (size_t)rank); }

/* One allocation holding send (ns elements) and recv (nr) with recv = send + shift. */
static int32_t *lay_out(coll_comm_t *c, int arena, size_t ns, size_t nr, long shift, int32_t **send,
                        int32_t **recv) {
  size_t n = (ns > nr ? ns : nr) + (size_t)labs(shift);
  void *base = NULL;
  if (arena ? coll_arena_alloc(c, n * 4, 64, &base) != 0 : (base = calloc(n, 4)) == NULL) return NULL;
  int32_t *b = base;
  *send = shift >= 0 ? b : b - shift;
  *recv = shift >= 0 ? b + shift : b;
  return b;
}

static void release(coll_comm_t *c, int arena, int32_t *base) {
  if (arena) coll_arena_free(c, base);
  else free(base);
}

static int check(const char *what, int rank, const int32_t *got, const int32_t *want, size_t n,
                 long shift, int arena) {
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) {
      fprintf(stderr, "rank %d: %s shift=%ld %s: element %zu is %d, expected %d\n", rank, what, shift,
              arena ? "arena" : "private", i, got[i], want[i]);
      return 1;
    }
  return 0;
}

/* gather, scatter and reduce to the last rank: only the root's send and recv
 * overlap (the others have one buffer, or two that never do). */
static int rank_rooted(coll_comm_t *c, int rank, int size, int arena, long sh, int32_t *want) {
  size_t P = (size_t)size, wide = P * N;
  int root = size - 1, me_root = rank == root, bad = 0;
  int32_t *send, *recv, *base;
  int32_t *mine = malloc(wide * 4);
  /* gather: N -> P*N on the root */
  if ((base = lay_out(c, arena, N, me_root ? wide : N, me_root ? sh : 0, &send, &recv)) == NULL) return 1;
  if (!me_root) send = base, recv = NULL;
  for (size_t i = 0; i < N; i++) send[i] = val(rank, i);
  for (size_t q = 0; q < P; q++)
    for (size_t i = 0; i < N; i++) want[q * N + i] = val((int)q, i);
  coll_args_t g = {.kind = COLL_GATHER, .dtype = COLL_INT32, .root = root, .count = N, .send = send, .recv = recv};
  bad |= coll_run(c, &g) != 0 || (me_root && check("gather", rank, recv, want, wide, sh, arena));
  release(c, arena, base);
  /* scatter: P*N on the root -> N */
  if ((base = lay_out(c, arena, me_root ? wide : N, N, me_root ? sh : 0, &send, &recv)) == NULL) return 1;
  if (!me_root) send = NULL, recv = base;
  else
    for (size_t i = 0; i < wide; i++) send[i] = val(rank, i);
  for (size_t i = 0; i < N; i++) mine[i] = val(root, (size_t)rank * N + i);
  coll_args_t sc = {.kind = COLL_SCATTER, .dtype = COLL_INT32, .root = root, .count = N, .send = send, .recv = recv};
  bad |= coll_run(c, &sc) != 0 || check("scatter", rank, recv, mine, N, sh, arena);
  release(c, arena, base);
  /* reduce: N -> N on the root */
  if (labs(sh) < N) {
    if ((base = lay_out(c, arena, N, N, me_root ? sh : 0, &send, &recv)) == NULL) return 1;
    if (!me_root) send = base, recv = NULL;
    for (size_t i = 0; i < N; i++) send[i] = val(rank, i);
    for (size_t i = 0; i < N; i++) {
      mine[i] = 0;
      for (int q = 0; q < size; q++) mine[i] += val(q, i);
    }
    coll_args_t r = {.kind = COLL_REDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .root = root, .count = N,
                     .send = send, .recv = recv};
    bad |= coll_run(c, &r) != 0 || (me_root && check("reduce", rank, recv, mine, N, sh, arena));
    release(c, arena, base);
  }
  free(mine);
  return bad;
}

static int rank_overlap(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  size_t P = (size_t)size, wide = P * N;
  int32_t *want = malloc(wide * 4);
  const long shifts[] = {3, -3, 1536, -1536, N / 2, -(N / 2), (long)wide / 2 + 1};
  int bad = 0;
  for (int arena = 0; arena < 2 && !bad; arena++)
    for (size_t s = 0; s < sizeof shifts / sizeof shifts[0] && !bad; s++) {
      long sh = shifts[s];
      int32_t *send, *recv, *base;
      if (labs(sh) < N) { /* allreduce: N -> N */
        if ((base = lay_out(c, arena, N, N, sh, &send, &recv)) == NULL) return 1;
        for (size_t i = 0; i < N; i++) send[i] = val(rank, i);
        for (size_t i = 0; i < N; i++) {
          want[i] = 0;
          for (int q = 0; q < size; q++) want[i] += val(q, i);
        }
        coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = N,
                         .send = send, .recv = recv};
        bad |= coll_run(c, &a) != 0 || check("allreduce", rank, recv, want, N, sh, arena);
        release(c, arena, base);
      }
      /* allgather: N -> P*N */
      if ((base = lay_out(c, arena, N, wide, sh, &send, &recv)) == NULL) return 1;
      for (size_t i = 0; i < N; i++) send[i] = val(rank, i);
      for (size_t q = 0; q < P; q++)
        for (size_t i = 0; i < N; i++) want[q * N + i] = val((int)q, i);
      coll_args_t g = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = N, .send = send, .recv = recv};
      bad |= coll_run(c, &g) != 0 || check("allgather", rank, recv, want, wide, sh, arena);
      release(c, arena, base);
      /* alltoall: P*N -> P*N, block q of rank r lands in block r of rank q */
      if ((base = lay_out(c, arena, wide, wide, sh, &send, &recv)) == NULL) return 1;
      for (size_t i = 0; i < wide; i++) send[i] = val(rank, i);
      for (size_t q = 0; q < P; q++)
        for (size_t i = 0; i < N; i++) want[q * N + i] = val((int)q, (size_t)rank * N + i);
      coll_args_t t = {.kind = COLL_ALLTOALL, .dtype = COLL_INT32, .count = N, .send = send, .recv = recv};
      bad |= coll_run(c, &t) != 0 || check("alltoall", rank, recv, want, wide, sh, arena);
      release(c, arena, base);
      /* reduce_scatter: P*N -> N, block r summed over ranks */
      if ((base = lay_out(c, arena, wide, N, sh, &send, &recv)) == NULL) return 1;
      for (size_t i = 0; i < wide; i++) send[i] = val(rank, i);
      for (size_t i = 0; i < N; i++) {
        want[i] = 0;
        for (int q = 0; q < size; q++) want[i] += val(q, (size_t)rank * N + i);
      }
      coll_args_t rs = {.kind = COLL_REDUCE_SCATTER, .dtype = COLL_INT32, .op = COLL_SUM, .count = N,
                        .send = send, .recv = recv};
      bad |= coll_run(c, &rs) != 0 || check("reduce_scatter", rank, recv, want, N, sh, arena);
      release(c, arena, base);
      bad |= rank_rooted(c, rank, size, arena, sh, want);
    }
  free(want);
  coll_comm_free(c);
  return bad;
}

/* Rank 0's private copy cannot be made (an alltoall of 2 x 32 GiB whose send
 * and recv overlap: malloc refuses it, and the buffers are never touched); rank
 * 1 calls the matching collective on real buffers. Both must get an error at
 * once, not wait for the timeout, and the communicator stays failed. */
static int rank_no_memory(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  size_t count = (size_t)32 << 30; /* uint8 elements per block */
  static uint8_t small[64];
  uint8_t *fake = (uint8_t *)((uintptr_t)1 << 44);
  coll_args_t a = {.kind = COLL_ALLTOALL, .dtype = COLL_UINT8, .count = count,
                   .send = rank == 0 ? fake : small, .recv = rank == 0 ? fake + 64 : small};
  double t0 = now_s();
  int rc = rank == 0 ? coll_run(c, &a) : 0;
  if (rank != 0) { /* the same collective; it fails before any data of it moves */
    coll_args_t b = {.kind = COLL_BARRIER};
    rc = coll_run(c, &b) == 0 ? 0 : -1;
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  int again = coll_run(c, &b);
  int bad = 0;
  if (rank == 0 && rc != -ENOMEM) bad = 1, fprintf(stderr, "rank 0: got %d, expected -ENOMEM\n", rc);
  if (rank != 0 && rc == 0) bad = 1, fprintf(stderr, "rank %d: the collective succeeded\n", rank);
  if (again == 0) bad = 1, fprintf(stderr, "rank %d: the communicator still works\n", rank);
  if (now_s() - t0 > 10) bad = 1, fprintf(stderr, "rank %d: waited %.1f s\n", rank, now_s() - t0);
  coll_comm_free(c);
  return bad;
}

int main(void) {
  const char *const small_slots[] = {"HBMCOLL_SLOT_BYTES=4096", NULL};
  for (int P = 1; P <= 3; P++) spawn_expect("overlapping send and recv, slot=4096", P, 120, small_slots,
                                            rank_overlap, NULL, -1);
  for (int P = 1; P <= 2; P++)
    spawn_expect("no memory for the private copy", P, 60, NULL, rank_no_memory, NULL, -1);
  return harness_finish();
}
