/*
 * test_errors.c - every way a collective can fail, over real processes.
 *
 *  codes      coll_strerror / coll_err_name for every COLL_ERRNO_MAP entry,
 *             0 and some -errno (in this process).
 *  badarg     invalid arguments to every entry point -> COLL_EBADARG, caught
 *             before anything is communicated (the communicator stays usable).
 *  mismatch   ranks disagree on count, dtype, op, root, kind or forced
 *             algorithm -> COLL_EMISMATCH on every rank (P = 2 and 3),
 *             including "every rank thinks another one is the root" and
 *             multi-chunk messages; every later call fails the same way.
 *  peerlost   a rank killed with SIGKILL before or during a collective ->
 *             COLL_EPEERLOST on the others, long before the timeout.
 *  timeout    a rank that does not call -> -ETIMEDOUT (HBMCOLL_TIMEOUT=2) on
 *             the others and, later, on itself; request wait timeouts.
 *  abort      coll_comm_abort on one rank -> COLL_EABORTED everywhere.
 *  interrupt  the interrupt callback ends a wait with COLL_EINTERRUPTED.
 *  bootstrap  disagreeing sizes, a rank claimed twice, a missing rank ->
 *             COLL_EBOOTSTRAP with a sentence from coll_comm_error.
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

/* After a failure with `code`: every later call and coll_comm_error say the same. */
static int expect_failed(coll_comm_t *c, int code, const char *what) {
  int bad = 0, rank = coll_comm_rank(c);
  const char *text = NULL;
  int e = coll_comm_error(c, &text);
  EXPECT(e == code, "rank %d (%s): coll_comm_error = %s, want %s", rank, what, coll_err_name(e), coll_err_name(code));
  EXPECT(text != NULL && text[0] != '\0', "rank %d (%s): coll_comm_error gave no text", rank, what);
  coll_args_t b = {.kind = COLL_BARRIER};
  int rc = coll_run(c, &b);
  EXPECT(rc == code, "rank %d (%s): barrier afterwards = %s, want %s", rank, what, coll_err_name(rc), coll_err_name(code));
  int32_t x = 1, y = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &x, .recv = &y};
  rc = coll_run(c, &a);
  EXPECT(rc == code, "rank %d (%s): allreduce afterwards = %s, want %s", rank, what, coll_err_name(rc), coll_err_name(code));
  coll_req_t *req = NULL;
  rc = coll_start(c, &a, &req);
  if (rc == 0) {
    rc = coll_req_wait(req, -1);
    coll_req_free(req);
  }
  EXPECT(rc == code, "rank %d (%s): coll_start afterwards = %s, want %s", rank, what, coll_err_name(rc), coll_err_name(code));
  coll_comm_t *sub = NULL;
  rc = coll_comm_split(c, 0, 0, &sub);
  EXPECT(rc == code, "rank %d (%s): split afterwards = %s, want %s", rank, what, coll_err_name(rc), coll_err_name(code));
  if (rc == 0) coll_comm_free(sub);
  return bad;
}

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

/* ---- a rank dies --------------------------------------------------------------------- */

typedef struct {
  int victim;
  int when; /* 0: before calling, 1: in the middle of a run of collectives, 2: during bootstrap barrier */
} kill_case_t;

static int rank_peerlost(int rank, int size, const char *key, void *arg) {
  const kill_case_t *kc = arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 120, &c)) return 1; /* far beyond the harness timeout */
  int bad = 0;
  size_t n = 1 << 20; /* 4 MiB per rank: 16 slot chunks */
  float *x = calloc(n, sizeof *x), *y = calloc(n, sizeof *y);
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = n, .send = x, .recv = y};
  coll_args_t b = {.kind = COLL_BARRIER};
  if (coll_run(c, &b) != 0) return 1;
  if (rank == kc->victim) {
    if (kc->when == 0) raise(SIGKILL);
    /* die with a collective in flight on the progress thread */
    for (int i = 0; i < 3; i++) coll_run(c, &a);
    coll_req_t *req;
    coll_start(c, &a, &req);
    usleep(500);
    raise(SIGKILL);
  }
  double t0 = now_s();
  int rc = 0, calls = 0;
  while (rc == 0 && calls < 100000) {
    rc = coll_run(c, &a);
    calls++;
  }
  double dt = now_s() - t0;
  EXPECT(rc == COLL_EPEERLOST, "rank %d: got %s after %d calls, want EPEERLOST", rank, coll_err_name(rc), calls);
  const char *text = "";
  coll_comm_error(c, &text);
  char want[64];
  snprintf(want, sizeof want, "rank %d", kc->victim);
  EXPECT(strstr(text, want) && strstr(text, "died"), "rank %d: error text '%s' does not name the victim", rank, text);
  if (rc == COLL_EPEERLOST) bad |= expect_failed(c, COLL_EPEERLOST, "peer lost");
  if (dt > 10) fprintf(stderr, "rank %d: note: EPEERLOST took %.1f s\n", rank, dt);
  free(x);
  free(y);
  coll_comm_free(c);
  return bad;
}

/* A rank dies while the others are still creating the communicator. */
static int rank_die_in_create(int rank, int size, const char *key, void *arg) {
  (void)arg;
  if (rank == size - 1) raise(SIGKILL);
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = 3};
  coll_comm_t *c = NULL;
  int rc = coll_comm_create(&cfg, &c), bad = 0;
  const char *text = "";
  if (c) coll_comm_error(c, &text);
  EXPECT(rc == COLL_EBOOTSTRAP, "rank %d: create with a dead rank = %s (%s)", rank, coll_err_name(rc), text);
  EXPECT(text[0] != '\0', "rank %d: no text", rank);
  coll_comm_free(c);
  return bad;
}

/* A rank that finished its part and left is not a lost peer. Bcast from an
 * arena root: the root returns only when every receiver read its buffer.
 * Rank 2 reads and exits at once; rank 1 is slow (its interrupt callback,
 * called from its wait for the late root, sleeps a second). The root waits
 * for rank 1 meanwhile and must not fail because rank 2 is gone. */
static int slow_callback(void *arg) {
  int *calls = arg;
  if ((*calls)++ == 0) usleep(1000 * 1000);
  return 0;
}

static int rank_left_early(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc, calls = 0;
  size_t n = 4096;
  uint8_t *buf = NULL;
  if (rank == 0) {
    if ((rc = coll_arena_alloc(c, n, 64, (void **)&buf)) != 0) return 1;
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 7);
  } else {
    buf = calloc(1, n);
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &b) == 0, "rank %d: barrier", rank);
  if (rank == 1) coll_comm_set_interrupt(c, slow_callback, &calls);
  if (rank == 0) usleep(500 * 1000); /* the others wait in the slow path */
  coll_args_t a = {.kind = COLL_BCAST, .dtype = COLL_UINT8, .root = 0, .count = n, .recv = buf};
  rc = coll_run(c, &a);
  EXPECT(rc == 0, "rank %d: bcast = %s", rank, coll_err_name(rc));
  for (size_t i = 0; i < n && rc == 0; i++)
    if (buf[i] != (uint8_t)(i * 7)) {
      EXPECT(0, "rank %d: byte %zu", rank, i);
      break;
    }
  if (rank == 1) EXPECT(calls > 0, "rank 1: the callback never ran: the test proves nothing");
  if (rank == 0) coll_arena_free(c, buf);
  else free(buf);
  coll_comm_free(c);
  return bad; /* rank 2 leaves right away */
}

/* ---- timeouts ------------------------------------------------------------------------- */

static int rank_timeout(int rank, int size, const char *key, void *arg) {
  int nonblocking = arg != NULL;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1; /* HBMCOLL_TIMEOUT=2 */
  int bad = 0, rc;
  int64_t x[5] = {1, 2, 3, 4, 5}, y[5 * MAX_RANKS];
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT64, .count = 5, .send = x, .recv = y};
  coll_args_t b = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &b) == 0, "rank %d: first barrier", rank);
  if (rank == size - 1) {
    sleep(4); /* never calls in time */
  } else {
    double t0 = now_s();
    if (nonblocking) {
      coll_req_t *req;
      rc = coll_start(c, &a, &req);
      if (rc == 0) {
        int r2 = coll_req_wait(req, 0.2); /* this wait runs out first; the request goes on */
        EXPECT(r2 == -ETIMEDOUT, "rank %d: short wait = %s", rank, coll_err_name(r2));
        int fin = coll_req_test(req, &r2);
        EXPECT(fin == 0, "rank %d: request done early", rank);
        rc = coll_req_wait(req, -1);
        coll_req_free(req);
      }
    } else {
      rc = coll_run(c, &a);
    }
    EXPECT(rc == -ETIMEDOUT, "rank %d: got %s after %.1f s, want ETIMEDOUT", rank, coll_err_name(rc), now_s() - t0);
  }
  rc = coll_run(c, &a); /* the late rank calls at last: the communicator is failed */
  EXPECT(rc == -ETIMEDOUT, "rank %d: later call = %s, want ETIMEDOUT", rank, coll_err_name(rc));
  const char *text = "";
  coll_comm_error(c, &text);
  EXPECT(strstr(text, "timed out") != NULL, "rank %d: text '%s'", rank, text);
  bad |= expect_failed(c, -ETIMEDOUT, "timeout");
  coll_comm_free(c);
  return bad;
}

/* A request wait that runs out is not a failure: the collective goes on. */
static int rank_wait_timeout(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  int32_t x = rank + 1, y = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &x, .recv = &y};
  if (rank == 0) {
    coll_req_t *req;
    if ((rc = coll_start(c, &a, &req)) != 0) return 1;
    rc = coll_req_wait(req, 0.1);
    EXPECT(rc == -ETIMEDOUT, "short wait = %s", coll_err_name(rc));
    rc = coll_req_wait(req, 30);
    EXPECT(rc == 0, "second wait = %s", coll_err_name(rc));
    coll_req_free(req);
  } else {
    usleep(600 * 1000);
    rc = coll_run(c, &a);
    EXPECT(rc == 0, "rank %d: allreduce = %s", rank, coll_err_name(rc));
  }
  EXPECT(y == size * (size + 1) / 2, "rank %d: allreduce = %d", rank, y);
  EXPECT(coll_comm_error(c, NULL) == 0, "rank %d: comm failed", rank);
  coll_comm_free(c);
  return bad;
}

/* ---- abort and interrupt ------------------------------------------------------------- */

static int rank_abort(int rank, int size, const char *key, void *arg) {
  int reason = (int)(intptr_t)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0;
  int want = reason < 0 && reason > COLL_ERR_LAST_ ? reason : COLL_EABORTED;
  int64_t x[3] = {0}, y[3];
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT64, .op = COLL_MAX, .count = 3, .send = x, .recv = y};
  if (rank == 0) {
    usleep(100 * 1000); /* let the others wait first */
    coll_comm_abort(c, reason);
  }
  int rc = coll_run(c, &a);
  EXPECT(rc == want, "rank %d: got %s, want %s", rank, coll_err_name(rc), coll_err_name(want));
  bad |= expect_failed(c, want, "abort");
  coll_comm_free(c);
  return bad;
}

static int interrupt_after(void *arg) {
  int *calls = arg;
  return ++*calls >= 3;
}

static int rank_interrupt(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc, calls = 0;
  coll_args_t b = {.kind = COLL_BARRIER};
  if (rank == 0) {
    coll_comm_set_interrupt(c, interrupt_after, &calls);
    rc = coll_run(c, &b); /* rank 1 comes late: the callback ends the wait */
    EXPECT(rc == COLL_EINTERRUPTED, "rank 0: got %s, want EINTERRUPTED", coll_err_name(rc));
    EXPECT(calls >= 3, "rank 0: callback called %d times", calls);
    const char *text = "";
    coll_comm_error(c, &text);
    EXPECT(strstr(text, "interrupted") != NULL, "rank 0: text '%s'", text);
  } else {
    usleep(3000 * 1000);
    rc = coll_run(c, &b);
    EXPECT(rc != 0, "rank %d: barrier after the interrupt succeeded", rank);
  }
  rc = coll_run(c, &b);
  EXPECT(rc != 0, "rank %d: later barrier succeeded", rank);
  coll_comm_free(c);
  return bad;
}

/* ---- bootstrap --------------------------------------------------------------------- */

typedef struct {
  int sizes[4]; /* what each process says the size is */
  int ranks[4]; /* and its rank */
  int nprocs;
} boot_case_t;

static int rank_bootstrap(int proc, int nprocs, const char *key, void *arg) {
  const boot_case_t *bc = arg;
  (void)nprocs;
  coll_comm_config_t cfg = {.rank = bc->ranks[proc], .size = bc->sizes[proc], .job_key = key, .timeout_s = 3};
  coll_comm_t *c = NULL;
  double t0 = now_s();
  int rc = coll_comm_create(&cfg, &c), bad = 0;
  const char *text = "";
  if (c) coll_comm_error(c, &text);
  EXPECT(rc == COLL_EBOOTSTRAP, "process %d (rank %d of %d): got %s (%s), want EBOOTSTRAP", proc, cfg.rank, cfg.size,
         coll_err_name(rc), text);
  EXPECT(c != NULL && text[0] != '\0', "process %d: no error text", proc);
  if (now_s() - t0 > 20) fprintf(stderr, "process %d: note: %.1f s to fail\n", proc, now_s() - t0);
  if (getenv("TEST_VERBOSE")) fprintf(stderr, "process %d: %s: %s\n", proc, coll_err_name(rc), text);
  coll_comm_free(c);
  return bad;
}

/* ---- main ------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  const char *const timeout2[] = {"HBMCOLL_TIMEOUT=2", NULL};
  char name[128];
  if (CASE("codes")) test_codes();
  for (int P = 1; P <= 3; P++)
    if (CASE("badarg")) spawn_expect("badarg", P, 60, NULL, rank_badarg, NULL, -1);
  for (int P = 2; P <= 3; P++)
    for (size_t i = 0; i < sizeof mm_cases / sizeof mm_cases[0]; i++)
      if (CASE(mm_cases[i].name)) spawn_expect(mm_cases[i].name, P, 60, NULL, rank_mismatch, (void *)&mm_cases[i], -1);
  for (int P = 2; P <= 4; P++)
    for (int when = 0; when < 2; when++) {
      kill_case_t kc = {.victim = P - 1 - when * (P > 2), .when = when};
      snprintf(name, sizeof name, "peerlost: rank %d killed %s", kc.victim, when ? "mid-collective" : "before calling");
      if (CASE(name)) spawn_expect(name, P, 60, NULL, rank_peerlost, &kc, kc.victim);
    }
  if (CASE("peerlost: not a peer that finished and left"))
    spawn_expect("peerlost: not a peer that finished and left", 3, 60, NULL, rank_left_early, NULL, -1);
  for (int P = 2; P <= 3; P++)
    if (CASE("peerlost: a rank dies before create")) spawn_expect("peerlost: a rank dies before create", P, 60, NULL, rank_die_in_create, NULL, P - 1);
  for (int P = 2; P <= 3; P++) {
    if (CASE("timeout: a rank never calls")) spawn_expect("timeout: a rank never calls", P, 60, timeout2, rank_timeout, NULL, -1);
    if (CASE("timeout: a rank never calls, nonblocking"))
      spawn_expect("timeout: a rank never calls, nonblocking", P, 60, timeout2, rank_timeout, (void *)1, -1);
    if (CASE("timeout: request wait runs out")) spawn_expect("timeout: request wait runs out", P, 60, NULL, rank_wait_timeout, NULL, -1);
  }
  for (int P = 2; P <= 3; P++) {
    if (CASE("abort")) spawn_expect("abort", P, 60, NULL, rank_abort, (void *)(intptr_t)0, -1);
    if (CASE("abort with a library code"))
      spawn_expect("abort with a library code", P, 60, NULL, rank_abort, (void *)(intptr_t)COLL_EMISMATCH, -1);
  }
  if (CASE("interrupt")) spawn_expect("interrupt", 2, 60, NULL, rank_interrupt, NULL, -1);
  static const struct {
    const char *name;
    boot_case_t bc;
  } boots[] = {
      {"bootstrap: rank 0 says 2, rank 1 says 3", {{2, 3}, {0, 1}, 2}},
      {"bootstrap: rank 0 says 3, rank 1 says 2", {{3, 2}, {0, 1}, 2}},
      {"bootstrap: sizes 3, 3, 2", {{3, 3, 2}, {0, 1, 1}, 3}},
      {"bootstrap: rank 1 twice", {{3, 3, 3}, {0, 1, 1}, 3}},
      {"bootstrap: rank 2 missing", {{3, 3}, {0, 1}, 2}},
      {"bootstrap: no rank 0", {{2}, {1}, 1}},
  };
  for (size_t i = 0; i < sizeof boots / sizeof boots[0]; i++)
    if (CASE(boots[i].name)) spawn_expect(boots[i].name, boots[i].bc.nprocs, 60, NULL, rank_bootstrap, (void *)&boots[i].bc, -1);
  return harness_finish();
}
