/*
 * test_errors.c - errors in what the caller asks for, over real processes (failures of
 * the ranks themselves are test_errors_peers.c's).
 *
 *  codes      coll_strerror / coll_err_name for every COLL_ERRNO_MAP entry,
 *             0 and some -errno (in this process).
 *  badarg     invalid arguments to every entry point -> COLL_EBADARG, caught
 *             before anything is communicated (the communicator stays usable).
 *  mismatch   ranks disagree on count, dtype, op, root, kind or forced
 *             algorithm -> COLL_EMISMATCH on every rank (P = 2 and 3),
 *             including "every rank thinks another one is the root" and
 *             multi-chunk messages; every later call fails the same way.
 *
 * Prints one line per case and a last line "N passed, N failed"; exits 1 on
 * any failure.
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

/* ---- harness: fork P ranks, wait with a timeout, kill stragglers ------------ */

#define HARNESS_KEY_PREFIX "hbet"
#define MAX_RANKS 16
#define HARNESS_NAME_WIDTH 52
#include "harness.h"
#include "expect_failed.h"

/* ---- codes ----------------------------------------------------------------------- */

static void test_codes(void) {
  int bad = 0;
  double t0 = now_s();
  struct {
    int code;
    const char *name, *text;
  } table[] = {
#define ROW(name, value, text) {COLL_##name, #name, text},
      COLL_ERRNO_MAP(ROW)
#undef ROW
  };
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
    EXPECT(table[i].code <= -20000 && table[i].code > COLL_ERR_LAST_, "%s = %d is outside the reserved range",
           table[i].name, table[i].code);
    EXPECT(strcmp(coll_err_name(table[i].code), table[i].name) == 0, "coll_err_name(%d) = %s, want %s",
           table[i].code, coll_err_name(table[i].code), table[i].name);
    EXPECT(strcmp(coll_strerror(table[i].code), table[i].text) == 0, "coll_strerror(%s) = '%s'", table[i].name,
           coll_strerror(table[i].code));
    for (size_t j = 0; j < i; j++) EXPECT(table[i].code != table[j].code, "%s and %s share a value", table[i].name, table[j].name);
  }
  EXPECT(strcmp(coll_err_name(0), "OK") == 0, "coll_err_name(0) = %s", coll_err_name(0));
  EXPECT(strcmp(coll_strerror(0), "success") == 0, "coll_strerror(0) = %s", coll_strerror(0));
  static const struct {
    int err;
    const char *name;
  } errnos[] = {{ETIMEDOUT, "ETIMEDOUT"}, {ENOMEM, "ENOMEM"}, {EINVAL, "EINVAL"},
                {EPERM, "EPERM"},         {ENOSPC, "ENOSPC"}, {EADDRINUSE, "EADDRINUSE"}};
  for (size_t i = 0; i < sizeof errnos / sizeof errnos[0]; i++) {
    int e = errnos[i].err;
    EXPECT(strcmp(coll_err_name(-e), errnos[i].name) == 0, "coll_err_name(-%s) = %s", errnos[i].name, coll_err_name(-e));
    EXPECT(strcmp(coll_strerror(-e), strerror(e)) == 0, "coll_strerror(-%s) = '%s'", errnos[i].name, coll_strerror(-e));
  }
  /* other -errno: strerror text, name UNKNOWN; unknown codes never NULL */
  EXPECT(strcmp(coll_strerror(-EBADF), strerror(EBADF)) == 0, "coll_strerror(-EBADF) = '%s'", coll_strerror(-EBADF));
  EXPECT(strcmp(coll_err_name(-EBADF), "UNKNOWN") == 0, "coll_err_name(-EBADF) = %s", coll_err_name(-EBADF));
  static const int odd[] = {1, 42, -5000, -20000, COLL_ERR_LAST_, -20100, -100000, INT32_MIN, INT32_MAX};
  for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
    const char *t = coll_strerror(odd[i]), *n = coll_err_name(odd[i]);
    EXPECT(t != NULL && t[0] != '\0', "coll_strerror(%d) is empty", odd[i]);
    EXPECT(n != NULL && strcmp(n, "UNKNOWN") == 0, "coll_err_name(%d) = %s", odd[i], n ? n : "(null)");
  }
  record(!bad, "codes: strerror / err_name", 1, now_s() - t0, bad ? "see stderr" : NULL);
}

/* ---- bad arguments ---------------------------------------------------------------- */

static int rank_badarg(int rank, int size, const char *key, void *arg) {
  (void)arg;
  int bad = 0, rc;
  coll_comm_t *c = NULL;
  /* coll_comm_create */
  coll_comm_config_t cfgs[] = {
      {.rank = 0, .size = 0, .job_key = key},     {.rank = -1, .size = 2, .job_key = key},
      {.rank = 2, .size = 2, .job_key = key},     {.rank = 0, .size = 1, .job_key = NULL},
      {.rank = 0, .size = 1, .job_key = ""},      {.rank = 0, .size = -3, .job_key = key},
  };
  for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
    c = NULL;
    rc = coll_comm_create(&cfgs[i], &c);
    EXPECT(rc == COLL_EBADARG, "coll_comm_create(bad config %zu) = %s", i, coll_err_name(rc));
    coll_comm_free(c);
  }
  EXPECT(coll_comm_create(NULL, &c) == COLL_EBADARG, "coll_comm_create(NULL, ...)");
  coll_comm_config_t good = {.rank = rank, .size = size, .job_key = key};
  EXPECT(coll_comm_create(&good, NULL) == COLL_EBADARG, "coll_comm_create(..., NULL)");
  char longkey[400];
  memset(longkey, 'k', sizeof longkey - 1);
  longkey[sizeof longkey - 1] = '\0';
  coll_comm_config_t lk = {.rank = 0, .size = 1, .job_key = longkey};
  c = NULL;
  rc = coll_comm_create(&lk, &c);
  EXPECT(rc == COLL_EBADARG, "coll_comm_create(400-byte key) = %s", coll_err_name(rc));
  coll_comm_free(c);
  /* the NULL communicator */
  EXPECT(coll_comm_rank(NULL) == -1 && coll_comm_size(NULL) == -1, "rank/size of NULL");
  EXPECT(coll_comm_error(NULL, NULL) == COLL_EBADARG, "coll_comm_error(NULL)");
  coll_comm_free(NULL);
  coll_comm_abort(NULL, 0);
  coll_args_t barrier = {.kind = COLL_BARRIER};
  coll_req_t *req = NULL;
  EXPECT(coll_run(NULL, &barrier) == COLL_EBADARG, "coll_run(NULL comm)");
  EXPECT(coll_start(NULL, &barrier, &req) == COLL_EBADARG, "coll_start(NULL comm)");
  EXPECT(coll_req_wait(NULL, 1) == COLL_EBADARG, "coll_req_wait(NULL)");
  EXPECT(coll_req_test(NULL, NULL) == COLL_EBADARG, "coll_req_test(NULL)");
  coll_req_free(NULL);
  EXPECT(coll_set_algorithm(NULL, COLL_ALLREDUCE, "rsag") == COLL_EBADARG, "coll_set_algorithm(NULL)");
  void *p = NULL;
  EXPECT(coll_arena_alloc(NULL, 64, 64, &p) == COLL_EBADARG, "coll_arena_alloc(NULL)");
  EXPECT(coll_comm_split(NULL, 0, 0, &c) == COLL_EBADARG, "coll_comm_split(NULL)");

  if ((rc = comm_open(rank, size, key, 0, &c)) != 0) return 1;
  int32_t x[8] = {0}, y[8 * MAX_RANKS] = {0};
  coll_args_t ok = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 8, .send = x, .recv = y};
  EXPECT(coll_run(c, NULL) == COLL_EBADARG, "coll_run(NULL args)");
  EXPECT(coll_start(c, NULL, &req) == COLL_EBADARG, "coll_start(NULL args)");
  EXPECT(coll_start(c, &ok, NULL) == COLL_EBADARG, "coll_start(NULL req_p)");
  struct {
    coll_args_t a;
    const char *what;
  } cases[] = {
      {{.kind = (coll_kind_t)-1, .dtype = COLL_INT32, .count = 1, .send = x, .recv = y}, "kind -1"},
      {{.kind = COLL_KIND_COUNT, .dtype = COLL_INT32, .count = 1, .send = x, .recv = y}, "kind COUNT"},
      {{.kind = COLL_ALLREDUCE, .dtype = (coll_dtype_t)-1, .count = 1, .send = x, .recv = y}, "dtype -1"},
      {{.kind = COLL_ALLREDUCE, .dtype = COLL_DTYPE_COUNT, .count = 1, .send = x, .recv = y}, "dtype COUNT"},
      {{.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_OP_COUNT, .count = 1, .send = x, .recv = y}, "op COUNT"},
      {{.kind = COLL_REDUCE_SCATTER, .dtype = COLL_INT32, .op = (coll_op_t)-2, .count = 1, .send = x, .recv = y}, "op -2"},
      {{.kind = COLL_BCAST, .dtype = COLL_INT32, .root = -1, .count = 1, .recv = y}, "root -1"},
      {{.kind = COLL_GATHER, .dtype = COLL_INT32, .root = size, .count = 1, .send = x, .recv = y}, "root == size"},
      {{.kind = COLL_REDUCE, .dtype = COLL_INT32, .root = 1 << 20, .count = 1, .send = x, .recv = y}, "root huge"},
      {{.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .count = 1, .send = NULL, .recv = y}, "allreduce send NULL"},
      {{.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .count = 1, .send = x, .recv = NULL}, "allreduce recv NULL"},
      {{.kind = COLL_BCAST, .dtype = COLL_INT32, .count = 1, .send = x, .recv = NULL}, "bcast buf NULL"},
      {{.kind = COLL_ALLTOALL, .dtype = COLL_INT32, .count = 1, .send = NULL, .recv = y}, "alltoall send NULL"},
      {{.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 1, .send = x, .recv = NULL}, "allgather recv NULL"},
      {{.kind = COLL_SCATTER, .dtype = COLL_INT32, .root = 0, .count = 1, .send = x, .recv = NULL}, "scatter recv NULL"},
      {{.kind = COLL_ALLREDUCE, .dtype = COLL_INT64, .count = SIZE_MAX / 4, .send = x, .recv = y}, "count overflows"},
      {{.kind = COLL_ALLTOALL, .dtype = COLL_INT32, .count = SIZE_MAX / 4 / (size_t)size + 1, .send = x, .recv = y}, "count*size overflows"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    rc = coll_run(c, &cases[i].a);
    EXPECT(rc == COLL_EBADARG, "rank %d: coll_run(%s) = %s", rank, cases[i].what, coll_err_name(rc));
    req = NULL;
    rc = coll_start(c, &cases[i].a, &req);
    EXPECT(rc == COLL_EBADARG && req == NULL, "rank %d: coll_start(%s) = %s", rank, cases[i].what, coll_err_name(rc));
  }
  /* root-only buffers are not needed elsewhere; counts of 0 need no buffers */
  if (size > 1) {
    coll_args_t g = {.kind = COLL_GATHER, .dtype = COLL_INT32, .root = 0, .count = 1, .send = x, .recv = rank == 0 ? y : NULL};
    EXPECT((rc = coll_run(c, &g)) == 0, "rank %d: gather with recv NULL off the root = %s", rank, coll_err_name(rc));
  }
  coll_args_t z = {.kind = COLL_ALLTOALL, .dtype = COLL_INT32, .count = 0};
  EXPECT((rc = coll_run(c, &z)) == 0, "rank %d: alltoall count 0, NULL buffers = %s", rank, coll_err_name(rc));
  /* algorithms */
  EXPECT(coll_set_algorithm(c, COLL_KIND_COUNT, "flat") == COLL_EBADARG, "set_algorithm(bad kind)");
  EXPECT(coll_set_algorithm(c, (coll_kind_t)-1, "flat") == COLL_EBADARG, "set_algorithm(kind -1)");
  EXPECT(coll_set_algorithm(c, COLL_ALLREDUCE, "nosuch") == COLL_EBADARG, "set_algorithm(unknown name)");
  EXPECT(coll_set_algorithm(c, COLL_GATHER, "rsag") == COLL_EBADARG, "set_algorithm(gather, rsag)");
  EXPECT(coll_set_algorithm(c, COLL_ALLREDUCE, "auto") == 0, "set_algorithm(auto)");
  EXPECT(coll_set_algorithm(c, COLL_BCAST, "arena") == 0, "set_algorithm(bcast, arena)");
  EXPECT(coll_set_algorithm(c, COLL_BCAST, NULL) == 0, "set_algorithm(NULL)");
  EXPECT(strcmp(coll_kind_name(COLL_KIND_COUNT), "unknown") == 0, "coll_kind_name(COUNT)");
  /* arena */
  EXPECT(coll_arena_alloc(c, 64, 0, &p) == COLL_EBADARG, "arena align 0");
  EXPECT(coll_arena_alloc(c, 64, 3, &p) == COLL_EBADARG, "arena align 3");
  EXPECT(coll_arena_alloc(c, 64, 8192, &p) == COLL_EBADARG, "arena align 8192");
  /* split's comm_p */
  EXPECT(coll_comm_split(c, 0, 0, NULL) == COLL_EBADARG, "split(NULL comm_p)");
  /* nothing above was communicated: the communicator still works */
  for (int i = 0; i < 8; i++) x[i] = rank + i;
  rc = coll_run(c, &ok);
  EXPECT(rc == 0, "rank %d: allreduce after the bad calls = %s", rank, coll_err_name(rc));
  for (int i = 0; i < 8 && rc == 0; i++)
    EXPECT(y[i] == size * (size - 1) / 2 + size * i, "rank %d: allreduce[%d] = %d", rank, i, y[i]);
  EXPECT(coll_comm_error(c, NULL) == 0, "rank %d: coll_comm_error after bad calls", rank);
  coll_comm_free(c);
  return bad;
}

/* ---- disagreeing arguments ----------------------------------------------------------- */

typedef struct {
  const char *name;
  /* args of rank r; count/dtype/op/root/kind/algo */
  void (*make)(int rank, int size, coll_args_t *a, const char **algo);
  size_t max_elems; /* per-rank send/recv capacity in elements (x size) */
} mm_case_t;

static void mm_count(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .count = r == P - 1 ? 8 : 7};
}
static void mm_count_big(int r, int P, coll_args_t *a, const char **algo) {
  *algo = "rsag";
  *a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .count = r == P - 1 ? 300001 : 300000};
}
static void mm_count_flat_big(int r, int P, coll_args_t *a, const char **algo) {
  (void)P;
  *algo = "flat";
  *a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .count = r == 0 ? 300001 : 300000};
}
static void mm_dtype(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = r == P - 1 ? COLL_FLOAT32 : COLL_INT32, .count = 7};
}
static void mm_op(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_REDUCE_SCATTER, .dtype = COLL_INT32, .op = r == P - 1 ? COLL_MAX : COLL_SUM, .count = 5};
}
static void mm_reduce_op(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = COLL_REDUCE, .dtype = COLL_INT32, .op = r == 0 ? COLL_MAX : COLL_SUM, .root = 1, .count = 5};
}
static void mm_root(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_BCAST, .dtype = COLL_INT64, .root = r == P - 1 ? 1 : 0, .count = 9};
}
static void mm_root_big(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_BCAST, .dtype = COLL_INT64, .root = r == P - 1 ? 1 : 0, .count = 300000};
}
static void mm_bcast_self_root(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = COLL_BCAST, .dtype = COLL_INT64, .root = r, .count = 9};
}
static void mm_bcast_self_root_big(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = COLL_BCAST, .dtype = COLL_INT64, .root = r, .count = 300000};
}
static void mm_algo(int r, int P, coll_args_t *a, const char **algo) {
  (void)P;
  *algo = r == 0 ? "rsag" : "flat";
  *a = (coll_args_t){.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT64, .count = 1000};
}
static void mm_kind(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = r == P - 1 ? COLL_BARRIER : COLL_ALLREDUCE, .dtype = COLL_INT32, .count = 3};
}
static void mm_kind2(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = r == 0 ? COLL_GATHER : COLL_BCAST, .dtype = COLL_INT32, .root = 0, .count = 3};
}
static void mm_kind3(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = r == 0 ? COLL_ALLTOALL : COLL_ALLGATHER, .dtype = COLL_INT32, .count = 3};
}
/* every rank names the next one as root: nobody thinks it is the root */
static void mm_gather_noroot(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_GATHER, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 3};
}
static void mm_gather_noroot_big(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_GATHER, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 300000};
}
static void mm_reduce_noroot(int r, int P, coll_args_t *a, const char **algo) {
  *algo = "flat";
  *a = (coll_args_t){.kind = COLL_REDUCE, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 3};
}
static void mm_reduce_noroot_big(int r, int P, coll_args_t *a, const char **algo) {
  *algo = "flat";
  *a = (coll_args_t){.kind = COLL_REDUCE, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 300000};
}
static void mm_scatter_noroot(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  *a = (coll_args_t){.kind = COLL_SCATTER, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 3};
}
static void mm_gather_vs_reduce(int r, int P, coll_args_t *a, const char **algo) {
  *algo = "flat";
  *a = (coll_args_t){.kind = r == 0 ? COLL_GATHER : COLL_REDUCE, .dtype = COLL_INT32, .root = (r + 1) % P, .count = 3};
}
static void mm_gather_root_count(int r, int P, coll_args_t *a, const char **algo) {
  (void)algo;
  (void)P;
  *a = (coll_args_t){.kind = COLL_GATHER, .dtype = COLL_INT32, .root = 0, .count = r == 1 ? 300001 : 300000};
}

static const mm_case_t mm_cases[] = {
    {"mismatch: count", mm_count, 8},
    {"mismatch: count, rsag, many chunks", mm_count_big, 300001},
    {"mismatch: count, flat, many chunks", mm_count_flat_big, 300001},
    {"mismatch: dtype", mm_dtype, 7},
    {"mismatch: op (reduce_scatter)", mm_op, 5},
    {"mismatch: op (reduce, off the root)", mm_reduce_op, 5},
    {"mismatch: root (bcast)", mm_root, 9},
    {"mismatch: root (bcast), many chunks", mm_root_big, 300000},
    {"mismatch: bcast, every rank names itself root", mm_bcast_self_root, 9},
    {"mismatch: same, many chunks", mm_bcast_self_root_big, 300000},
    {"mismatch: forced algorithm", mm_algo, 1000},
    {"mismatch: kind (barrier vs allreduce)", mm_kind, 3},
    {"mismatch: kind (gather vs bcast)", mm_kind2, 3},
    {"mismatch: kind (alltoall vs allgather)", mm_kind3, 3},
    {"mismatch: gather, every rank names another root", mm_gather_noroot, 3},
    {"mismatch: same, many chunks", mm_gather_noroot_big, 300000},
    {"mismatch: reduce, every rank names another root", mm_reduce_noroot, 3},
    {"mismatch: same, many chunks", mm_reduce_noroot_big, 300000},
    {"mismatch: scatter, every rank names another root", mm_scatter_noroot, 3},
    {"mismatch: gather vs reduce, no root", mm_gather_vs_reduce, 3},
    {"mismatch: gather count, many chunks", mm_gather_root_count, 300001},
};

static int rank_mismatch(int rank, int size, const char *key, void *arg) {
  const mm_case_t *mc = arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 20, &c)) return 1; /* a hang shows up as ETIMEDOUT */
  int bad = 0;
  /* good collectives first, so the disagreement is not in collective #1: a barrier and a
   * 64 KiB allreduce, in place in the arena on rank 0 (with 2 ranks flat's first round then
   * hands over to rsag: two descriptors for one call); the message numbers the caller's
   * collectives, so this is #3 whatever the library ran inside */
  coll_args_t b = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &b) == 0, "rank %d: first barrier", rank);
  static float ar_in[16384], ar_out[16384];
  void *ar_arena = NULL;
  if (rank == 0) EXPECT(coll_arena_alloc(c, sizeof ar_in, 64, &ar_arena) == 0, "arena");
  coll_args_t ar = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM,
                    .count = 16384, .send = ar_arena ? ar_arena : ar_in,
                    .recv = ar_arena ? ar_arena : ar_out};
  EXPECT(coll_run(c, &ar) == 0, "rank %d: good allreduce", rank);
  coll_args_t a;
  const char *algo = NULL;
  mc->make(rank, size, &a, &algo);
  size_t cap = mc->max_elems * (size_t)size * 8;
  void *send = calloc(1, cap), *recv = calloc(1, cap);
  if (!a.send) a.send = send;
  if (!a.recv) a.recv = recv;
  if (algo) coll_set_algorithm(c, a.kind, algo);
  int rc = coll_run(c, &a);
  /* a rank that only gives (a bcast's root, a small gather's or reduce's sender) returns at
   * once and learns of the disagreement when it settles (its next call, or
   * coll_comm_settle, which returns 0 at once after a call that needs no check) */
  if (rc == 0) rc = coll_comm_settle(c);
  EXPECT(rc == COLL_EMISMATCH, "rank %d: %s: got %s, want EMISMATCH", rank, mc->name, coll_err_name(rc));
  const char *text = "";
  coll_comm_error(c, &text);
  EXPECT(strstr(text, "disagree") != NULL, "rank %d: error text '%s'", rank, text);
  EXPECT(strstr(text, "collective #3:") != NULL, "rank %d: counted calls, '%s'", rank, text);
  if (!bad) bad = expect_failed(c, COLL_EMISMATCH, mc->name);
  free(send);
  free(recv);
  if (ar_arena) coll_arena_free(c, ar_arena);
  coll_comm_free(c);
  return bad;
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  if (CASE("codes")) test_codes();
  for (int P = 1; P <= 3; P++)
    if (CASE("badarg")) spawn_expect("badarg", P, 60, NULL, rank_badarg, NULL, -1);
  for (int P = 2; P <= 3; P++)
    for (size_t i = 0; i < sizeof mm_cases / sizeof mm_cases[0]; i++)
      if (CASE(mm_cases[i].name)) spawn_expect(mm_cases[i].name, P, 60, NULL, rank_mismatch, (void *)&mm_cases[i], -1);
  return harness_finish();
}
