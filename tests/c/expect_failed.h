/*
 * expect_failed.h - after a communicator failed with a code, every later call and
 * coll_comm_error must say the same (header-only, after harness.h: uses EXPECT). Shared
 * by test_errors.c (disagreeing arguments) and test_errors_peers.c (a rank dies, times
 * out or aborts).
 */
#ifndef HBMCOLL_TESTS_C_EXPECT_FAILED_H
#define HBMCOLL_TESTS_C_EXPECT_FAILED_H

#include <stdint.h>

#include "coll.h"

/* After a failure with `code`: every later call and coll_comm_error say the same. */
static inline int expect_failed(coll_comm_t *c, int code, const char *what) {
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

#endif
