/*
 * test_requests.c - nonblocking collectives: several coll_start requests in flight mixed
 * with coll_run, waited out of order; waiting on a request after coll_comm_free. Forked
 * ranks check every byte (coll_ops.h).
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

#define HARNESS_KEY_PREFIX "hbcr"
#define MAX_RANKS 128
#include "harness.h"
#include "coll_ops.h"

/* ---- nonblocking requests ------------------------------------------------------ */


static int rank_requests(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  size_t slot = env_slot_bytes();
  int bad = 0, rc;
  unsigned salt = 5000;
  for (int iter = 0; iter < 6 && !bad; iter++) {
    enum { NOPS = 6 };
    op_t ops[NOPS];
    coll_req_t *reqs[NOPS];
    memset(ops, 0, sizeof ops);
    static const coll_kind_t kinds[NOPS] = {COLL_ALLREDUCE, COLL_BCAST,    COLL_ALLGATHER,
                                            COLL_ALLTOALL,  COLL_REDUCE_SCATTER, COLL_GATHER};
    for (int i = 0; i < NOPS; i++) {
      ops[i].kind = kinds[i];
      ops[i].root = (iter + i) % size;
      ops[i].mode = (iter + i) % 2;
      ops[i].salt = ++salt;
      ops[i].rcase = (iter + i) % NRCASES;
      ops[i].dtype = move_dtypes[(size_t)(iter + i) % 5];
      ops[i].count = (iter + i) % 3 == 0 ? (3 * slot + 100) / 8 + 1 : (size_t)(iter * 7 + i);
      if (ops[i].kind == COLL_ALLREDUCE) ops[i].arena = iter % 2 ? AR_SEND | AR_RECV : 0;
    }
    /* start 0..2, a blocking call, start 3..5, another blocking call, wait in reverse */
    for (int i = 0; i < NOPS && !bad; i++) {
      op_prepare(c, &ops[i]);
      if ((rc = coll_start(c, &ops[i].a, &reqs[i])) != 0) {
        fprintf(stderr, "rank %d: coll_start: %s\n", rank, coll_err_name(rc));
        return 1;
      }
      if (i == 2 || i == NOPS - 1) {
        op_t o;
        memset(&o, 0, sizeof o);
        o.kind = i == 2 ? COLL_ALLREDUCE : COLL_SCATTER;
        o.root = iter % size;
        o.salt = ++salt;
        o.count = 13;
        o.dtype = COLL_INT32;
        bad |= op_run(c, &o);
      }
    }
    int done = 0;
    for (int spin = 0; spin < 1000000 && !done; spin++) { /* coll_req_test on the first */
      int res = 0;
      if (coll_req_test(reqs[0], &res)) done = 1;
      else usleep(100);
    }
    if (!done) fprintf(stderr, "rank %d: coll_req_test never said done\n", rank), bad = 1;
    for (int i = NOPS - 1; i >= 0; i--) bad |= req_finish(c, reqs[i], &ops[i], coll_kind_name(ops[i].kind));
    /* blocking calls once the queue is empty run inline again */
    op_t o;
    memset(&o, 0, sizeof o);
    o.kind = COLL_ALLREDUCE;
    o.salt = ++salt;
    o.count = 100;
    bad |= op_run(c, &o);
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

/* coll_comm_free with a request still queued: the request fails with
 * COLL_EABORTED, and waiting on it afterwards (then freeing it) is fine. */
static int rank_free_pending(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 5, &c)) return 1;
  int bad = 0, rc;
  static int32_t x[4], y[4];
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 4, .send = x, .recv = y};
  coll_req_t *r1 = NULL, *r2 = NULL;
  if ((rc = coll_start(c, &a, &r1)) != 0 || (rc = coll_start(c, &a, &r2)) != 0) {
    fprintf(stderr, "rank %d: coll_start: %s\n", rank, coll_err_name(rc));
    return 1;
  }
  if ((rc = coll_req_wait(r1, -1)) != 0) fprintf(stderr, "rank %d: first request: %s\n", rank, coll_err_name(rc)), bad = 1;
  coll_req_free(r1);
  if ((rc = coll_req_wait(r2, -1)) != 0) fprintf(stderr, "rank %d: second request: %s\n", rank, coll_err_name(rc)), bad = 1;
  /* a third one may or may not have run when the communicator goes away */
  coll_req_t *r3 = NULL;
  if ((rc = coll_start(c, &a, &r3)) != 0) return 1;
  coll_comm_free(c);
  rc = coll_req_wait(r3, 1.0);
  if (rc != 0 && rc != COLL_EABORTED && rc != COLL_EPEERLOST && rc != -ETIMEDOUT)
    fprintf(stderr, "rank %d: request after free: %s\n", rank, coll_err_name(rc)), bad = 1;
  coll_req_free(r3);
  coll_req_free(r2);
  return bad;
}

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
  const char *const small_slots[] = {"HBMCOLL_SLOT_BYTES=4096", NULL};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int P = sizes[i];
    if (CASE("requests")) spawn("requests", P, 300, NULL, rank_requests, NULL);
    if (CASE("requests slot=4096")) spawn("requests slot=4096", P, 300, small_slots, rank_requests, NULL);
    if (CASE("free with request pending")) spawn("free with request pending", P, 60, NULL, rank_free_pending, NULL);
  }
  return harness_finish();
}
