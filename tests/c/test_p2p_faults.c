/*
 * test_p2p_faults.c - point-to-point when things go wrong: a timed-out receive is withdrawn, and
 * misuse; Ctrl-C through the interrupt callback (also ending a freed unfinished send); a peer
 * that dies while a rank waits for it (small and large messages); a long wait warns; two
 * ranks exchanging while a third is blocked outside the library. Each with the receiver pulling
 * (CMA) and through the cells (HBMCOLL_P2P_CMA=0).
 *
 *   build/ctest/test_p2p_faults [case-substring]
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbcf"
#define MAX_RANKS 8
#include "harness.h"
#include "p2p_pattern.h"

/* A receive that times out is withdrawn: a message sent later goes to the next receive. Then
 * misuse, refused before anything travels. */
static int rank_withdraw(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  double x = 0;
  if (rank == 1) {
    coll_req_t *r;
    double lost = -1;
    EXPECT(coll_irecv(c, &lost, sizeof lost, 0, 2, &r) == 0, "irecv");
    EXPECT((rc = coll_req_wait(r, 0.1)) == -ETIMEDOUT, "wait(0.1): %s", coll_err_name(rc));
    EXPECT((rc = coll_req_cancel(r)) == 0, "cancel: %s", coll_err_name(rc));
    EXPECT(coll_req_wait(r, -1) == -ECANCELED, "cancelled result");
    coll_req_free(r);
    EXPECT(coll_send(c, &x, sizeof x, 0, 1) == 0, "go"); /* now rank 0 sends tag 2 */
    EXPECT(coll_recv(c, &x, sizeof x, 0, 2, NULL) == 0 && x == 42.0 && lost == -1, "x %g lost %g", x, lost);
  } else {
    EXPECT(coll_recv(c, &x, sizeof x, 1, 1, NULL) == 0, "go");
    x = 42.0;
    EXPECT(coll_send(c, &x, sizeof x, 1, 2) == 0, "send");
  }
  EXPECT(coll_send(c, &x, 1, size, 0) == COLL_EBADARG, "dest out of range");
  EXPECT(coll_send(c, &x, 1, 0, -1) == COLL_EBADARG, "negative tag");
  EXPECT(coll_recv(c, &x, 1, -2, 0, NULL) == COLL_EBADARG, "source -2");
  EXPECT(coll_send(c, NULL, 1, 0, 0) == COLL_EBADARG, "NULL buffer");
  EXPECT(coll_send(NULL, &x, 1, 0, 0) == COLL_EBADARG, "NULL comm");
  coll_comm_free(c);
  return bad;
}

static double interrupt_at;
static int interrupt_after(void *arg) {
  (void)arg;
  return now_s() > interrupt_at;
}

/* Ctrl-C: a blocking receive whose interrupt check fires returns COLL_EINTERRUPTED, withdrawn;
 * the communicator stays usable for the next exchange. */
static int rank_interrupt(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = 30,
                            .interrupt = interrupt_after};
  coll_comm_t *c = NULL;
  interrupt_at = 1e18;
  if (coll_comm_create(&cfg, &c)) return 1;
  int bad = 0, rc;
  double x = 1;
  if (rank == 1) {
    interrupt_at = now_s() + 0.2;
    EXPECT((rc = coll_recv(c, &x, sizeof x, 0, 9, NULL)) == COLL_EINTERRUPTED, "recv: %s", coll_err_name(rc));
    interrupt_at = 1e18;
    EXPECT(coll_comm_error(c, NULL) == 0, "the communicator failed");
    EXPECT(coll_send(c, &x, sizeof x, 0, 1) == 0, "go");
    EXPECT(coll_recv(c, &x, sizeof x, 0, 9, NULL) == 0 && x == 9, "after: %g", x);
  } else {
    EXPECT(coll_recv(c, &x, sizeof x, 1, 1, NULL) == 0, "go");
    x = 9;
    EXPECT(coll_send(c, &x, sizeof x, 1, 9) == 0, "send");
  }
  coll_comm_free(c);
  return bad;
}

/* Rank 0 dies (SIGKILL) while rank 1 waits in a receive from it: COLL_EPEERLOST, well before
 * the timeout; with `arg` the receive is a large one that is being pulled at the time. */
static int rank_dies(int rank, int size, const char *key, void *arg) {
  coll_comm_t *c;
  if (comm_open(rank, size, key, 60, &c)) return 1;
  int bad = 0, rc;
  size_t n = arg ? (size_t)64 << 20 : 8;
  uint8_t *buf = malloc(n);
  memset(buf, 1, n);
  if (rank == 0) {
    if (arg) {
      coll_req_t *r;
      coll_isend(c, buf, n, 1, 0, &r); /* killed while (or before) rank 1 pulls it */
      usleep(20000);
    } else {
      usleep(300000);
    }
    kill(getpid(), SIGKILL);
  }
  double t0 = now_s();
  rc = coll_recv(c, buf, n, 0, 0, NULL);
  const char *text = "";
  coll_comm_error(c, &text);
  EXPECT(rc == COLL_EPEERLOST || (arg && rc == 0), "recv from a dead rank: %s (%s)", coll_err_name(rc), text);
  EXPECT(rc == 0 || strstr(text, "rank 0") != NULL, "text: %s", text);
  EXPECT(now_s() - t0 < 20, "took %.1f s", now_s() - t0);
  free(buf);
  coll_comm_free(c);
  return bad;
}

/* A request of an unfinished send freed (a dropped Python request) while its receiver never
 * calls in: the interrupt check (Ctrl-C) ends the wait. A rendezvous is revoked and the
 * communicator stays usable (nothing arrives later); a send half way through the cells fails
 * the communicator, as a blocking send would. */
static int rank_free_interrupt(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = 30,
                            .interrupt = interrupt_after};
  coll_comm_t *c = NULL;
  interrupt_at = 1e18;
  if (coll_comm_create(&cfg, &c)) return 1;
  int bad = 0, rc;
  size_t n = 16 << 20;
  uint8_t *buf = malloc(n);
  fill(buf, n, 5);
  coll_args_t ba = {.kind = COLL_BARRIER};
  const char *cma = getenv("HBMCOLL_P2P_CMA");
  int pulled = cma == NULL || strcmp(cma, "0") != 0;
  if (rank == 0) {
    coll_req_t *r = NULL;
    EXPECT((rc = coll_isend(c, buf, n, 1, 6, &r)) == 0, "isend: %s", coll_err_name(rc));
    interrupt_at = now_s() + 0.3;
    double t = now_s();
    coll_req_free(r); /* rank 1 is in a barrier: only the interrupt ends this */
    interrupt_at = 1e18;
    EXPECT(now_s() - t < 20, "free took %.1f s", now_s() - t);
    EXPECT((coll_comm_error(c, NULL) == 0) == pulled, "communicator error %d", coll_comm_error(c, NULL));
  }
  rc = coll_run(c, &ba);
  EXPECT((rc == 0) == pulled, "barrier: %s", coll_err_name(rc));
  if (rank == 1 && pulled) { /* the revoked message never comes */
    coll_req_t *r = NULL;
    EXPECT(coll_irecv(c, buf, n, 0, 6, &r) == 0, "irecv");
    EXPECT((rc = coll_req_wait(r, 0.5)) == -ETIMEDOUT, "irecv wait: %s", coll_err_name(rc));
    EXPECT(coll_req_cancel(r) == 0, "cancel");
    coll_req_free(r);
  }
  if (pulled) EXPECT((rc = coll_run(c, &ba)) == 0, "barrier after: %s", coll_err_name(rc)); /* rank 0 stays */
  free(buf);
  coll_comm_free(c);
  return bad;
}

/* A receive that waits past HBMCOLL_STALL_WARN says so through the warn callback, naming the
 * peer; the message still arrives. */
static char stall_text[512];
static void stall_warn(void *arg, const char *text) {
  (void)arg;
  snprintf(stall_text, sizeof stall_text, "%s", text);
}

static int rank_stall(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = 30, .warn = stall_warn};
  coll_comm_t *c = NULL;
  if (coll_comm_create(&cfg, &c)) return 1;
  int bad = 0, rc;
  double x = 0;
  if (rank == 0) {
    usleep(1500 * 1000);
    x = 4;
    EXPECT((rc = coll_send(c, &x, sizeof x, 1, 2)) == 0, "send: %s", coll_err_name(rc));
  } else {
    EXPECT((rc = coll_recv(c, &x, sizeof x, 0, 2, NULL)) == 0 && x == 4, "recv: %s", coll_err_name(rc));
    EXPECT(strstr(stall_text, "rank 1 has waited") && strstr(stall_text, "rank 0"), "warning: '%s'",
           stall_text);
  }
  coll_comm_free(c);
  return bad;
}

/* Ranks 0 and 1 exchange 2000 messages while rank 2 is blocked in read() on a pipe that rank 0
 * writes only afterwards: if the exchange needed rank 2 it would never end. */
static int quiet_pipe[2];
static int rank_bystander(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0;
  if (rank == 2) {
    char ch;
    EXPECT(read(quiet_pipe[0], &ch, 1) == 1, "pipe");
  } else if (rank < 2) {
    int other = 1 - rank;
    uint8_t *buf = malloc(1 << 20);
    for (int i = 0; i < 2000 && !bad; i++) {
      size_t len = i % 100 == 99 ? 1 << 20 : 16;
      if ((i + rank) % 2 == 0) {
        fill(buf, len, (unsigned)i);
        EXPECT(coll_send(c, buf, len, other, 0) == 0, "send %d", i);
      } else {
        EXPECT(coll_recv(c, buf, 1 << 20, other, 0, NULL) == 0 && check(buf, len, (unsigned)i), "recv %d", i);
      }
    }
    free(buf);
    if (rank == 0) EXPECT(write(quiet_pipe[1], "x", 1) == 1, "pipe");
  }
  coll_args_t ba = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &ba) == 0, "barrier after");
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  for (int cma = 1; cma >= 0; cma--) {
    const char *const *env = cma ? NULL : no_cma;
    P2P_RUN("a timed-out receive is withdrawn; misuse", 2, rank_withdraw, NULL, -1);
    P2P_RUN("interrupt", 2, rank_interrupt, NULL, -1);
    P2P_RUN("a peer dies during a small recv", 2, rank_dies, NULL, 0);
    P2P_RUN("a peer dies during a large recv", 2, rank_dies, (void *)1, 0);
    P2P_RUN("a freed unfinished send ends on an interrupt", 2, rank_free_interrupt, NULL, -1);
    char name[64];
    snprintf(name, sizeof name, "a long wait warns (%s)", cma ? "pulled" : "cells");
    const char *const stall_env[] = {"HBMCOLL_STALL_WARN=0.5", cma ? NULL : "HBMCOLL_P2P_CMA=0", NULL};
    if (CASE(name)) spawn_expect(name, 2, 60, stall_env, rank_stall, NULL, -1);
    if (pipe(quiet_pipe) == 0) {
      P2P_RUN("two exchange, the third is elsewhere", 3, rank_bystander, NULL, -1);
      close(quiet_pipe[0]);
      close(quiet_pipe[1]);
    }
  }
  return harness_finish();
}
