/*
 * test_errors_peers.c - a communicator whose ranks fail, over real processes (errors in
 * the arguments are test_errors.c's).
 *
 *  peerlost   a rank killed with SIGKILL before or during a collective ->
 *             COLL_EPEERLOST on the others, long before the timeout; a rank
 *             that dies before create; not a rank that finished and left.
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

#define HARNESS_KEY_PREFIX "hbep"
#define MAX_RANKS 16
#define HARNESS_NAME_WIDTH 52
#include "harness.h"
#include "expect_failed.h"

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
