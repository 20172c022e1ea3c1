/*
 * test_nodes_p2p.c - point-to-point on a communicator that spans nodes, from C (libcoll/src/nodes_p2p.c):
 * two emulated nodes of two ranks each (tests/c/nodes_job.h), every rank joined with coll_job_create.
 *
 *  - a ring of sends and receives (to the next rank, from the previous: a peer on this node for some,
 *    on the other node for others), 0 B to 4 MiB (the provider's eager and rendezvous), blocking and
 *    started; a send to this rank itself; then a collective on the same communicator;
 *  - COLL_ANY_SOURCE and COLL_ANY_TAG: rank 0 takes every other rank's two messages, and each rank's
 *    come in the order it sent them; a receive by tag takes the later message first;
 *  - a message longer than the receive: COLL_EMISMATCH with the whole length, then usable;
 *  - a receive nothing matches: -ETIMEDOUT from coll_req_wait, withdrawn by coll_req_cancel, and the
 *    message sent later goes to the next receive; 200 started sends and receives in flight at once;
 *  - a rank killed (SIGKILL) while the others wait to receive from it, its node mate in no call at all:
 *    COLL_EPEERLOST on both nodes, at once (not at the mate's next call); a 4 MiB isend to it is given up
 *    (its request freed while the provider may still hold it) and the next receive fails at once;
 *  - a split across the nodes has point-to-point of its own (its ranks, its messages);
 *  - an isend nobody receives, freed: given up at the communicator's timeout (no second wait), which
 *    fails the communicator and closes the endpoint; a pending irecv's free after that ends too.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coll.h"

#define HARNESS_KEY_PREFIX "hbnp"
#define NODES 2
#define PER 2
#define SIZE (NODES * PER)
#define HARNESS_NAME_WIDTH 48
#include "harness.h"
#include "netns.h"
#include "nodes_job.h"

static int say(int rank, const char *what, int rc, coll_comm_t *c) {
  const char *text = "";
  coll_comm_error(c, &text);
  fprintf(stderr, "rank %d: %s: %s (%s)\n", rank, what, coll_err_name(rc), text ? text : "");
  return 1;
}

static uint8_t byte_of(int from, size_t i, int round) { return (uint8_t)(from * 31 + (int)(i % 251) + round * 7); }

static int filled_by(const uint8_t *b, size_t n, int from, int round) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != byte_of(from, i, round)) return 0;
  return 1;
}

static int barrier(coll_comm_t *c) {
  coll_args_t a = {.kind = COLL_BARRIER};
  return coll_run(c, &a);
}

static int job_ring(coll_comm_t *c, int rank) {
  static const size_t sizes[] = {0, 8, 4000, 70000, 4u << 20};
  int next = (rank + 1) % SIZE, prev = (rank + SIZE - 1) % SIZE, rc;
  for (int round = 0; round < 10; round++) {
    size_t n = sizes[round % 5];
    uint8_t *out = malloc(n + 1), *in = malloc(n + 1);
    for (size_t i = 0; i < n; i++) out[i] = byte_of(rank, i, round);
    memset(in, 0xee, n + 1);
    coll_status_t st = {0};
    if (round < 5) { /* started receive, blocking send */
      coll_req_t *r = NULL;
      if ((rc = coll_irecv(c, in, n, prev, round, &r)) != 0) return say(rank, "irecv", rc, c);
      if ((rc = coll_send(c, out, n, next, round)) != 0) return say(rank, "send", rc, c);
      if ((rc = coll_req_wait(r, -1)) != 0 || (rc = coll_req_status(r, &st)) != 0) return say(rank, "wait", rc, c);
      coll_req_free(r);
    } else { /* started send, blocking receive */
      coll_req_t *s = NULL;
      if ((rc = coll_isend(c, out, n, next, round, &s)) != 0) return say(rank, "isend", rc, c);
      if ((rc = coll_recv(c, in, n, prev, round, &st)) != 0) return say(rank, "recv", rc, c);
      if ((rc = coll_req_wait(s, -1)) != 0) return say(rank, "isend's wait", rc, c);
      coll_req_free(s);
    }
    if (!filled_by(in, n, prev, round) || in[n] != 0xee || st.source != prev || st.tag != round || st.bytes != n)
      return fprintf(stderr, "rank %d: round %d (%zu B): wrong data or status (source %d tag %d bytes %zu)\n", rank,
                     round, n, st.source, st.tag, st.bytes), 1;
    free(out), free(in);
  }
  int32_t self = rank * 11, got = -1;
  coll_req_t *s = NULL;
  if ((rc = coll_isend(c, &self, 4, rank, 77, &s)) != 0 || (rc = coll_recv(c, &got, 4, rank, 77, NULL)) != 0 ||
      (rc = coll_req_wait(s, -1)) != 0 || got != rank * 11)
    return say(rank, "a send to itself", rc, c);
  coll_req_free(s);
  int32_t one = 1, sum = 0;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &one, .recv = &sum};
  if ((rc = coll_run(c, &a)) != 0 || sum != SIZE) return say(rank, "a collective after point-to-point", rc, c);
  return 0;
}

static int job_any(coll_comm_t *c, int rank) {
  int rc;
  if (rank != 0) {
    for (int k = 0; k < 2; k++) {
      int32_t v = rank * 10 + k;
      if ((rc = coll_send(c, &v, 4, 0, 100 + rank * 2 + k)) != 0) return say(rank, "send", rc, c);
    }
  } else {
    int seen[SIZE] = {0};
    for (int m = 0; m < 2 * (SIZE - 1); m++) {
      int32_t v = -1;
      coll_status_t st = {0};
      if ((rc = coll_recv(c, &v, 4, COLL_ANY_SOURCE, COLL_ANY_TAG, &st)) != 0) return say(rank, "recv any", rc, c);
      int k = seen[st.source]++;
      if (st.source < 1 || st.source >= SIZE || v != st.source * 10 + k || st.tag != 100 + st.source * 2 + k)
        return fprintf(stderr, "rank 0: message %d: %d from %d tag %d, out of order\n", m, v, st.source, st.tag), 1;
    }
  }
  if ((rc = barrier(c)) != 0) return say(rank, "barrier", rc, c);
  if (rank == 1) { /* tags 5, 6, 5 to rank 2, on the other node */
    int32_t v[3] = {1, 2, 3};
    for (int k = 0; k < 3; k++)
      if ((rc = coll_send(c, &v[k], 4, 2, k == 1 ? 6 : 5)) != 0) return say(rank, "send by tag", rc, c);
  }
  if (rank == 2) {
    int32_t a = 0, b = 0, d = 0;
    if ((rc = coll_recv(c, &b, 4, 1, 6, NULL)) != 0 || (rc = coll_recv(c, &a, 4, 1, 5, NULL)) != 0 ||
        (rc = coll_recv(c, &d, 4, COLL_ANY_SOURCE, 5, NULL)) != 0)
      return say(rank, "recv by tag", rc, c);
    if (a != 1 || b != 2 || d != 3) return fprintf(stderr, "rank 2: by tag got %d %d %d\n", a, b, d), 1;
  }
  return 0;
}

static int job_faults(coll_comm_t *c, int rank) {
  int rc, peer = rank ^ 2; /* on the other node */
  uint8_t big[100], small[40];
  for (size_t i = 0; i < sizeof big; i++) big[i] = byte_of(rank, i, 0);
  coll_status_t st = {0};
  if ((rc = coll_send(c, big, sizeof big, peer, 1)) != 0) return say(rank, "send", rc, c);
  rc = coll_recv(c, small, sizeof small, peer, 1, &st); /* the buffer's contents are unspecified then (coll.h) */
  if (rc != COLL_EMISMATCH || st.bytes != sizeof big || st.source != peer || st.tag != 1)
    return fprintf(stderr, "rank %d: a longer message: %s, %zu bytes\n", rank, coll_err_name(rc), st.bytes), 1;
  coll_req_t *r = NULL;
  int32_t v = -1;
  if ((rc = coll_irecv(c, &v, 4, peer, 9, &r)) != 0) return say(rank, "irecv", rc, c);
  if ((rc = coll_req_wait(r, 0.2)) != -ETIMEDOUT) return say(rank, "a receive nothing matches", rc, c);
  if ((rc = coll_req_cancel(r)) != 0) return say(rank, "cancel", rc, c);
  if ((rc = coll_req_wait(r, -1)) != -ECANCELED) return say(rank, "the cancelled receive's wait", rc, c);
  coll_req_free(r);
  if ((rc = barrier(c)) != 0) return say(rank, "barrier", rc, c);
  int32_t mine = rank + 500;
  if ((rc = coll_send(c, &mine, 4, peer, 9)) != 0 || (rc = coll_recv(c, &v, 4, peer, 9, NULL)) != 0 || v != peer + 500)
    return say(rank, "the message after a withdrawn receive", rc, c);
  enum { MANY = 100 };
  int32_t outs[MANY], ins[MANY];
  coll_req_t *reqs[2 * MANY];
  for (int k = 0; k < MANY; k++) {
    outs[k] = rank * 1000 + k, ins[k] = -1;
    if ((rc = coll_irecv(c, &ins[k], 4, peer, 20, &reqs[k])) != 0) return say(rank, "irecv (many)", rc, c);
    if ((rc = coll_isend(c, &outs[k], 4, peer, 20, &reqs[MANY + k])) != 0) return say(rank, "isend (many)", rc, c);
  }
  for (int k = 0; k < 2 * MANY; k++) {
    if ((rc = coll_req_wait(reqs[k], -1)) != 0) return say(rank, "wait (many)", rc, c);
    coll_req_free(reqs[k]);
  }
  for (int k = 0; k < MANY; k++)
    if (ins[k] != peer * 1000 + k) return fprintf(stderr, "rank %d: many: [%d] = %d\n", rank, k, ins[k]), 1;
  return 0;
}

static int job_killed(coll_comm_t *c, int rank) {
  int rc = barrier(c);
  if (rc) return say(rank, "barrier", rc, c);
  if (rank == 3) raise(SIGKILL);
  int32_t v = 0;
  double t0 = now_s();
  if (rank == 2) { /* its node mate: in no call while the others wait (the watch's guard notices) */
    sleep(6);
    rc = barrier(c);
  } else { /* a large send to it stays with the provider; given up, it must not be written to once freed */
    size_t n = 4u << 20;
    char *big = calloc(n, 1);
    coll_req_t *s = NULL;
    int src = coll_isend(c, big, n, 3, 2, &s);
    rc = coll_recv(c, &v, 4, 3, 1, NULL);
    int sent = src ? src : coll_req_wait(s, -1);
    coll_req_free(s);
    int32_t w = 0;
    int after = coll_recv(c, &w, 4, COLL_ANY_SOURCE, 5, NULL); /* the communicator failed: at once */
    free(big);
    if (sent == 0 || after != COLL_EPEERLOST)
      return fprintf(stderr, "rank %d: the send to the killed rank: %s, a receive after: %s\n", rank,
                     coll_err_name(sent), coll_err_name(after)), 1;
  }
  if (rc != COLL_EPEERLOST) return say(rank, "a receive from the killed rank", rc, c);
  const char *text = "";
  coll_comm_error(c, &text);
  fprintf(stderr, "    rank %d: %s\n", rank, text);
  if (rank != 2 && now_s() - t0 > 5) /* not a speed target: the order of events */
    return fprintf(stderr, "rank %d: the death was noticed only once rank 2 made a call\n", rank), 1;
  return 0;
}

/* HBMCOLL_TIMEOUT is 3 s: an isend nobody receives (posted: the peer is in a call, so the
 * connection is up), and an irecv nothing matches, freed. The send's free gives up at the timeout
 * (it used to wait again at every timeout, for ever) and fails the communicator, which closes the
 * endpoint before the buffer goes back; the receive's free then finds no endpoint to cancel on and
 * ends with the failure. */
static int job_given_up(coll_comm_t *c, int rank) {
  if (rank != 0) { /* rank 2, the peer of both, waits for a message that never comes: its endpoint
                    * connects and takes the send's announcement, but nothing matches it */
    int32_t w = 0;
    if (rank == 2) (void)coll_recv(c, &w, 4, 0, 7, NULL); /* ends when rank 0's failure reaches it */
    return 0;
  }
  size_t n = 4u << 20;
  char *big = calloc(n, 1);
  int32_t v = 0;
  coll_req_t *s = NULL, *r = NULL;
  int rc = coll_isend(c, big, n, 2, 4, &s);
  if (rc == 0) rc = coll_irecv(c, &v, 4, 2, 7, &r);
  if (rc) return free(big), say(rank, "isend/irecv", rc, c);
  double t0 = now_s();
  coll_req_free(s);
  double took = now_s() - t0;
  free(big);
  coll_req_free(r);
  const char *text = "";
  int failed = coll_comm_error(c, &text);
  fprintf(stderr, "    rank 0: freed after %.1f s: %s (%s)\n", took, coll_err_name(failed), text ? text : "");
  if (took > 20 || failed == 0)
    return fprintf(stderr, "rank 0: the free of a send nobody took: %.1f s, communicator %s\n", took,
                   coll_err_name(failed)), 1;
  return 0;
}

static int job_split(coll_comm_t *c, int rank) {
  coll_comm_t *sub = NULL;
  int rc = coll_comm_split(c, rank % 2, 0, &sub); /* {0, 2} and {1, 3}: across the nodes */
  if (rc) return say(rank, "split", rc, c);
  int32_t mine = rank, theirs = -1;
  coll_status_t st = {0};
  int other = 1 - coll_comm_rank(sub);
  if ((rc = coll_send(sub, &mine, 4, other, 3)) != 0 || (rc = coll_recv(sub, &theirs, 4, COLL_ANY_SOURCE, 3, &st)) != 0)
    return say(rank, "the split's send/recv", rc, sub);
  if (theirs != (rank + 2) % SIZE || st.source != other)
    return fprintf(stderr, "rank %d: split got %d from %d\n", rank, theirs, st.source), 1;
  coll_comm_free(sub);
  return barrier(c) ? say(rank, "barrier after the split", rc, c) : 0;
}

int main(void) {
  const scenario_t all[] = {
      {"send/recv ring across 2 nodes x 2, 0 B to 4 MiB", job_ring, -1, 0},
      {"ANY_SOURCE, ANY_TAG, order and tags across nodes", job_any, -1, 0},
      {"truncation, timeout, cancel, 200 in flight", job_faults, -1, 0},
      {"a rank killed while others receive: EPEERLOST", job_killed, 3, 0},
      {"a split across the nodes has its own send/recv", job_split, -1, 0},
      {"a send nobody takes, freed: given up at the timeout", job_given_up, -1, 0, "3"},
  };
  return scenarios_run(all, sizeof all / sizeof all[0], "point-to-point across emulated nodes", 33000);
}
