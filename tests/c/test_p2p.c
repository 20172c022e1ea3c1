/*
 * test_p2p.c - point-to-point (coll_send/recv/isend/irecv) moving data: sizes around the eager
 * limit and up to 16 MiB, with the receiver pulling (CMA) and through the cells
 * (HBMCOLL_P2P_CMA=0); ANY_SOURCE/ANY_TAG; order; truncation; irecv-send-wait both ways at
 * 16 MiB; send to self; collectives in between; isend across barriers; large messages back to
 * back. Every rank checks every byte it receives. The faults are in test_p2p_faults.c.
 *
 *   build/ctest/test_p2p [case-substring]
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

#define HARNESS_KEY_PREFIX "hbcp"
#define MAX_RANKS 8
#include "harness.h"
#include "p2p_pattern.h"

static const size_t sizes[] = {0, 1, COLL_P2P_EAGER_MAX - 1, COLL_P2P_EAGER_MAX, COLL_P2P_EAGER_MAX + 1,
                               65536, 1 << 20, 16 << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])
/* Rank 0 sends every size (blocking and isend), rank 1 receives (recv and irecv). */
static int rank_sizes(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  uint8_t *buf = malloc((16 << 20) + 64);
  for (size_t k = 0; k < NSIZES && !bad; k++) {
    size_t n = sizes[k];
    for (int nb = 0; nb < 2 && !bad; nb++) {
      unsigned salt = (unsigned)(k * 2 + (size_t)nb);
      if (rank == 0) {
        fill(buf, n, salt);
        if (nb) {
          coll_req_t *r;
          rc = coll_isend(c, buf, n, 1, (int)k, &r);
          EXPECT(rc == 0, "isend %zu: %s", n, coll_err_name(rc));
          if (rc == 0) EXPECT((rc = coll_req_wait(r, -1)) == 0, "isend wait %zu: %s", n, coll_err_name(rc));
          coll_req_free(r);
        } else {
          EXPECT((rc = coll_send(c, buf, n, 1, (int)k)) == 0, "send %zu: %s", n, coll_err_name(rc));
        }
      } else {
        memset(buf, 0xee, n + 64);
        coll_status_t st = {-5, -5, 0};
        if (nb) {
          coll_req_t *r;
          rc = coll_irecv(c, buf, n + 64, 0, (int)k, &r);
          EXPECT(rc == 0, "irecv %zu: %s", n, coll_err_name(rc));
          if (rc == 0) EXPECT((rc = coll_req_wait(r, -1)) == 0, "irecv wait %zu: %s", n, coll_err_name(rc));
          EXPECT(coll_req_status(r, &st) == 0, "status");
          coll_req_free(r);
        } else {
          EXPECT((rc = coll_recv(c, buf, n + 64, 0, (int)k, &st)) == 0, "recv %zu: %s", n, coll_err_name(rc));
        }
        EXPECT(st.source == 0 && st.tag == (int)k && st.bytes == n, "status %d %d %zu for %zu", st.source,
               st.tag, st.bytes, n);
        EXPECT(check(buf, n, salt), "bytes of %zu differ", n);
        EXPECT(buf[n] == 0xee, "wrote past %zu", n);
      }
    }
  }
  free(buf);
  coll_comm_free(c);
  return bad;
}

/* ANY_SOURCE/ANY_TAG: ranks 1..P-1 each send 3 tagged messages to 0, which takes them in any
 * order and checks each by its status; then a specific tag among them. */
static int rank_any(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  if (rank != 0) {
    for (int t = 0; t < 3; t++) {
      int v[2] = {rank, t};
      EXPECT((rc = coll_send(c, v, sizeof v, 0, 10 + t)) == 0, "send: %s", coll_err_name(rc));
    }
    int big = rank * 1000;
    EXPECT(coll_send(c, &big, sizeof big, 0, 99) == 0, "send 99");
  } else {
    int seen[MAX_RANKS][3] = {{0}};
    int last[MAX_RANKS];
    for (int r = 0; r < MAX_RANKS; r++) last[r] = -1;
    /* tag 99 first, from any source: it overtakes nothing of its sender's, it is just picked */
    for (int i = 0; i < size - 1; i++) {
      int v = 0;
      coll_status_t st;
      EXPECT((rc = coll_recv(c, &v, sizeof v, COLL_ANY_SOURCE, 99, &st)) == 0, "recv 99: %s", coll_err_name(rc));
      EXPECT(st.tag == 99 && v == st.source * 1000, "99 from %d: %d", st.source, v);
    }
    for (int i = 0; i < 3 * (size - 1); i++) {
      int v[2] = {-1, -1};
      coll_status_t st;
      EXPECT((rc = coll_recv(c, v, sizeof v, COLL_ANY_SOURCE, COLL_ANY_TAG, &st)) == 0, "recv: %s",
             coll_err_name(rc));
      EXPECT(st.source == v[0] && st.tag == 10 + v[1] && st.bytes == sizeof v, "status %d %d", st.source, st.tag);
      if (st.source > 0 && st.source < size) {
        EXPECT(v[1] == last[st.source] + 1, "from %d: %d after %d (order)", st.source, v[1], last[st.source]);
        last[st.source] = v[1];
        seen[st.source][v[1] % 3]++;
      }
    }
    for (int r = 1; r < size; r++)
      for (int t = 0; t < 3; t++) EXPECT(seen[r][t] == 1, "rank %d tag %d seen %d times", r, t, seen[r][t]);
  }
  coll_comm_free(c);
  return bad;
}

/* Order: 60 messages of one tag, sizes cycling through eager, rendezvous and empty, some sent
 * with isend, some with send; the receiver posts irecvs for the first half before they come. */
static int rank_order(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  enum { N = 60 };
  static const size_t lens[] = {8, 70000, 0, COLL_P2P_EAGER_MAX + 1, 3000, 300000};
  uint8_t *bufs[N];
  coll_req_t *reqs[N];
  for (int i = 0; i < N; i++) bufs[i] = malloc(300000 + 8);
  if (rank == 0) {
    for (int i = 0; i < N; i++) {
      size_t n = lens[i % 6];
      fill(bufs[i], n, (unsigned)i);
      if (i % 3 == 0) EXPECT((rc = coll_send(c, bufs[i], n, 1, 5)) == 0, "send %d: %s", i, coll_err_name(rc));
      else EXPECT((rc = coll_isend(c, bufs[i], n, 1, 5, &reqs[i])) == 0, "isend %d", i);
    }
    for (int i = 0; i < N; i++)
      if (i % 3) {
        EXPECT((rc = coll_req_wait(reqs[i], -1)) == 0, "wait %d: %s", i, coll_err_name(rc));
        coll_req_free(reqs[i]);
      }
  } else {
    for (int i = 0; i < N / 2; i++)
      EXPECT(coll_irecv(c, bufs[i], 300000 + 8, 0, 5, &reqs[i]) == 0, "irecv %d", i);
    for (int i = N / 2; i < N; i++) {
      coll_status_t st;
      EXPECT((rc = coll_recv(c, bufs[i], 300000 + 8, COLL_ANY_SOURCE, 5, &st)) == 0, "recv %d", i);
      EXPECT(st.bytes == lens[i % 6] && check(bufs[i], st.bytes, (unsigned)i), "message %d out of order", i);
    }
    for (int i = 0; i < N / 2; i++) {
      coll_status_t st;
      EXPECT((rc = coll_req_wait(reqs[i], -1)) == 0, "wait %d: %s", i, coll_err_name(rc));
      coll_req_status(reqs[i], &st);
      EXPECT(st.bytes == lens[i % 6] && check(bufs[i], st.bytes, (unsigned)i), "message %d out of order", i);
      coll_req_free(reqs[i]);
    }
  }
  for (int i = 0; i < N; i++) free(bufs[i]);
  coll_comm_free(c);
  return bad;
}

/* Truncation: a longer message is COLL_EMISMATCH for that receive alone, the front is filled,
 * and the next message arrives whole; eager and large. */
static int rank_truncate(int rank, int size, const char *key, void *arg) {
  (void)arg;
  (void)size;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  static const size_t lens[] = {80, 1 << 20};
  uint8_t *buf = malloc(1 << 20);
  for (int k = 0; k < 2; k++) {
    size_t n = lens[k];
    if (rank == 0) {
      fill(buf, n, 40 + (unsigned)k);
      EXPECT(coll_send(c, buf, n, 1, 1) == 0, "send long");
      fill(buf, 24, 50 + (unsigned)k);
      EXPECT(coll_send(c, buf, 24, 1, 1) == 0, "send next");
    } else {
      memset(buf, 0, n);
      coll_status_t st;
      rc = coll_recv(c, buf, n / 2 - 1, 0, 1, &st);
      EXPECT(rc == COLL_EMISMATCH, "truncated %zu: %s", n, coll_err_name(rc));
      EXPECT(st.bytes == n && st.source == 0 && st.tag == 1, "status bytes %zu", st.bytes);
      EXPECT(check(buf, n / 2 - 1, 40 + (unsigned)k) && buf[n / 2 - 1] == 0, "front of %zu", n);
      EXPECT(coll_comm_error(c, NULL) == 0, "the communicator failed");
      EXPECT((rc = coll_recv(c, buf, 100, 0, 1, &st)) == 0 && st.bytes == 24 && check(buf, 24, 50 + (unsigned)k),
             "the next message: %s", coll_err_name(rc));
    }
  }
  free(buf);
  coll_comm_free(c);
  return bad;
}

/* Both ranks: irecv, blocking send of 16 MiB, wait; then both send first, receive after. */
static int rank_swap(int rank, int size, const char *key, void *arg) {
  (void)arg;
  (void)size;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 60, &c)) return 1;
  int bad = 0, rc, other = 1 - rank;
  size_t n = 16 << 20;
  uint8_t *mine = malloc(n), *got = malloc(n);
  for (int round = 0; round < 2; round++) {
    fill(mine, n, (unsigned)(rank + 10 * round));
    memset(got, 0, n);
    if (round == 0) {
      coll_req_t *r;
      EXPECT(coll_irecv(c, got, n, other, 0, &r) == 0, "irecv");
      EXPECT((rc = coll_send(c, mine, n, other, 0)) == 0, "send: %s", coll_err_name(rc));
      EXPECT((rc = coll_req_wait(r, -1)) == 0, "wait: %s", coll_err_name(rc));
      coll_req_free(r);
    } else { /* unsafe in MPI; here the waiting sender pulls its peer's message meanwhile */
      EXPECT((rc = coll_send(c, mine, n, other, 1)) == 0, "send first: %s", coll_err_name(rc));
      EXPECT((rc = coll_recv(c, got, n, other, 1, NULL)) == 0, "recv after: %s", coll_err_name(rc));
    }
    EXPECT(check(got, n, (unsigned)(other + 10 * round)), "round %d: bytes differ", round);
  }
  free(mine);
  free(got);
  coll_comm_free(c);
  return bad;
}

/* Send to self: small and large, blocking before the receive and by isend. */
static int rank_self(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  size_t n = 1 << 20;
  uint8_t *a = malloc(n), *b = malloc(n);
  for (int k = 0; k < 2; k++) {
    size_t len = k ? n : 100;
    fill(a, len, 7 + (unsigned)k);
    EXPECT((rc = coll_send(c, a, len, rank, 3)) == 0, "send to self %zu: %s", len, coll_err_name(rc));
    memset(b, 0, len);
    EXPECT(coll_recv(c, b, len, rank, 3, NULL) == 0 && check(b, len, 7 + (unsigned)k), "recv self %zu", len);
    coll_req_t *r;
    EXPECT(coll_isend(c, a, len, rank, 4, &r) == 0, "isend self");
    memset(b, 0, len);
    EXPECT(coll_recv(c, b, len, COLL_ANY_SOURCE, 4, NULL) == 0 && check(b, len, 7 + (unsigned)k), "recv self");
    EXPECT(coll_req_wait(r, -1) == 0, "isend self wait");
    coll_req_free(r);
  }
  free(a);
  free(b);
  coll_comm_free(c);
  return bad;
}

/* Collectives and point-to-point in turn on one communicator, each checked. */
static int rank_mixed(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  int bad = 0, rc;
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  size_t n = 200000;
  uint8_t *a = malloc(n), *b = malloc(n);
  for (int it = 0; it < 20 && !bad; it++) {
    double v = rank + it, sum = 0;
    coll_args_t ar = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT64, .op = COLL_SUM, .count = 1, .send = &v, .recv = &sum};
    EXPECT((rc = coll_run(c, &ar)) == 0, "allreduce: %s", coll_err_name(rc));
    EXPECT(sum == size * (size - 1) / 2.0 + size * it, "sum %g", sum);
    size_t len = it % 2 ? n : 64;
    fill(a, len, (unsigned)(rank * 100 + it));
    coll_req_t *r;
    EXPECT(coll_irecv(c, b, n, left, it, &r) == 0, "irecv");
    coll_req_t *bar;
    coll_args_t ba = {.kind = COLL_BARRIER};
    EXPECT(coll_start(c, &ba, &bar) == 0, "ibarrier");
    EXPECT((rc = coll_send(c, a, len, right, it)) == 0, "send: %s", coll_err_name(rc));
    EXPECT((rc = coll_req_wait(r, -1)) == 0, "wait: %s", coll_err_name(rc));
    EXPECT(check(b, len, (unsigned)(left * 100 + it)), "iteration %d: bytes", it);
    EXPECT(coll_req_wait(bar, -1) == 0, "ibarrier wait");
    coll_req_free(bar);
    coll_req_free(r);
    int root = it % size, word = rank == root ? 77 + it : 0;
    coll_args_t bc = {.kind = COLL_BCAST, .dtype = COLL_INT32, .count = 1, .root = root, .send = &word, .recv = &word};
    EXPECT(coll_run(c, &bc) == 0 && word == 77 + it, "bcast");
  }
  free(a);
  free(b);
  coll_comm_free(c);
  return bad;
}

/* The sender goes elsewhere (a barrier) with its isend posted, while the receiver waits in
 * recv: the send must finish without the sender calling in (through the cells its helper
 * thread pushes the pieces). `arg`: the size. */
static int rank_isend_barrier(int rank, int size, const char *key, void *arg) {
  size_t n = (size_t)(uintptr_t)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 60, &c)) return 1;
  int bad = 0, rc;
  uint8_t *buf = malloc(n + 1);
  coll_args_t ba = {.kind = COLL_BARRIER};
  if (rank == 0) {
    fill(buf, n, 3);
    coll_req_t *r = NULL;
    EXPECT((rc = coll_isend(c, buf, n, 1, 4, &r)) == 0, "isend: %s", coll_err_name(rc));
    EXPECT((rc = coll_run(c, &ba)) == 0, "barrier: %s", coll_err_name(rc));
    if (r) EXPECT((rc = coll_req_wait(r, -1)) == 0, "wait: %s", coll_err_name(rc));
    coll_req_free(r);
  } else {
    EXPECT((rc = coll_recv(c, buf, n, 0, 4, NULL)) == 0, "recv: %s", coll_err_name(rc));
    EXPECT(check(buf, n, 3), "bytes of %zu differ", n);
    EXPECT((rc = coll_run(c, &ba)) == 0, "barrier: %s", coll_err_name(rc));
  }
  free(buf);
  coll_comm_free(c);
  return bad;
}

/* Large messages back to back, several in flight (both ends copy each, p2p_copy.c): a sender
 * still helping with one never writes into the next; sizes not a multiple of the chunk. */
static int rank_back_to_back(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 60, &c)) return 1;
  int bad = 0, rc;
  enum { N = 12 };
  size_t n = (300 << 10) + 77;
  uint8_t *buf = malloc(N * n);
  if (rank == 0) {
    coll_req_t *r[N];
    for (int k = 0; k < N; k++) {
      fill(buf + (size_t)k * n, n, 40u + (unsigned)k);
      EXPECT((rc = coll_isend(c, buf + (size_t)k * n, n, 1, k % 3, &r[k])) == 0, "isend %d: %s", k, coll_err_name(rc));
    }
    for (int k = 0; k < N; k++) {
      EXPECT((rc = coll_req_wait(r[k], -1)) == 0, "wait %d: %s", k, coll_err_name(rc));
      coll_req_free(r[k]);
    }
  } else {
    for (int k = 0; k < N; k++) {
      memset(buf, 0, n);
      EXPECT((rc = coll_recv(c, buf, n, 0, k % 3, NULL)) == 0, "recv %d: %s", k, coll_err_name(rc));
      EXPECT(check(buf, n, 40u + (unsigned)k), "message %d differs", k);
      if (k % 4 == 3) usleep(20000); /* the sender's waits go to sleep now and then */
    }
  }
  coll_args_t ba = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &ba) == 0, "barrier");
  free(buf);
  coll_comm_free(c);
  return bad;
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  for (int cma = 1; cma >= 0; cma--) {
    const char *const *env = cma ? NULL : no_cma;
    P2P_RUN("sizes 0 .. 16 MiB", 2, rank_sizes, NULL, -1);
    P2P_RUN("any source, any tag", 4, rank_any, NULL, -1);
    P2P_RUN("order of one pair's messages", 2, rank_order, NULL, -1);
    P2P_RUN("truncation", 2, rank_truncate, NULL, -1);
    P2P_RUN("irecv-send-wait 16 MiB, send before recv", 2, rank_swap, NULL, -1);
    P2P_RUN("send to self", 1, rank_self, NULL, -1);
    P2P_RUN("send to self, 2 ranks", 2, rank_self, NULL, -1);
    P2P_RUN("collectives in between", 3, rank_mixed, NULL, -1);
    P2P_RUN("isend 100 B; barrier; wait against recv; barrier", 2, rank_isend_barrier, (void *)(uintptr_t)100, -1);
    P2P_RUN("isend 16 MiB; barrier; wait against recv; barrier", 2, rank_isend_barrier,
        (void *)(uintptr_t)(16 << 20), -1);
    P2P_RUN("large messages back to back", 2, rank_back_to_back, NULL, -1);
  }
  return harness_finish();
}
