/*
 * net_ring.c - allreduce between nodes around a ring of bridge endpoints (net_ring.h).
 *
 * The message is cut into n segments (the first count % n one element longer), each
 * segment into K chunks of at most one slot, K the same for every segment so that all
 * members take the same steps. Reduce-scatter: at step s member m sends segment m - s to
 * its right and folds segment m - s - 1, arriving from its left, into its own buffer:
 * after n - 1 steps it holds segment m + 1 reduced over all members, computed by it alone.
 * Allgather: n - 1 more steps pass the finished segments on, copied, not reduced. So every
 * member ends with the same bits, for floats too.
 *
 * One transfer (transfer number t, counted on across collectives): wait for the credit of
 * t - 2 (the right neighbour has consumed slot t % 2), wait until my write of t - 2 left my
 * send slot, stage the chunk in send slot t % 2 and write it into the right neighbour's
 * receive slot t % 2 with the note t; then wait for the left neighbour's note t, take its
 * chunk out of my receive slot t % 2 and send the left neighbour credit t. Notes can arrive
 * in any order, so the last few of each kind are kept by number.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net_ring.h"

#define RING_CREDIT 0x80000000u /* a note's top bit: credit (from the right), else data */
#define RING_SEEN 8             /* notes kept by number, per kind */
#define RING_SCRATCH 4096       /* the pool's tail: where credits land */

struct coll__net_ring {
  coll__net_t *net;
  int n, me, left, right;
  size_t chunk;       /* bytes per slot */
  uint32_t next;      /* the next transfer's number */
  uint32_t data_seen[RING_SEEN], credit_seen[RING_SEEN];
  int have_data[RING_SEEN], have_credit[RING_SEEN];
};

static size_t ring_send_off(const coll__net_ring_t *r, uint32_t t) { return (t & 1) * r->chunk; }
static size_t ring_recv_off(const coll__net_ring_t *r, uint32_t t) { return (2 + (t & 1)) * r->chunk; }
static size_t ring_scratch_off(const coll__net_ring_t *r) { return 4 * r->chunk; }

int coll__net_ring_make(coll__net_t *net, int n, int me, int left, int right,
                        coll__net_ring_t **ring_p) {
  size_t pool = coll__net_pool_bytes(net);
  if (n < 1 || me < 0 || me >= n || pool < 65536) return COLL_EBADARG;
  coll__net_ring_t *r = calloc(1, sizeof *r);
  if (r == NULL) return -ENOMEM;
  r->net = net, r->n = n, r->me = me, r->left = left, r->right = right;
  r->chunk = ((pool - RING_SCRATCH) / 4) & ~(size_t)63;
  *ring_p = r;
  return 0;
}

void coll__net_ring_free(coll__net_ring_t *r) { free(r); }

static double ring_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Until the note (kind, t) came: every note that arrives meanwhile is kept by number. */
static int ring_wait(coll__net_ring_t *r, uint32_t kind, uint32_t t, double timeout_s, char *err,
                     size_t errlen) {
  uint32_t *seen = kind ? r->credit_seen : r->data_seen;
  int *have = kind ? r->have_credit : r->have_data;
  double until = timeout_s > 0 ? ring_now() + timeout_s : 0;
  for (unsigned spins = 0;; spins++) {
    if (have[t % RING_SEEN] && seen[t % RING_SEEN] == t) return 0;
    uint32_t note;
    int rc = coll__net_poll(r->net, &note, err, errlen);
    if (rc < 0) return rc;
    if (rc == 1) {
      uint32_t k = note & RING_CREDIT, num = note & ~RING_CREDIT;
      (k ? r->credit_seen : r->data_seen)[num % RING_SEEN] = num;
      (k ? r->have_credit : r->have_data)[num % RING_SEEN] = 1;
      continue;
    }
    if (until && (spins & 1023) == 0 && ring_now() > until) {
      snprintf(err, errlen, "no %s from the %s node's rank in %.0f s (transfer %u)",
               kind ? "credit" : "data", kind ? "next" : "previous", timeout_s, (unsigned)t);
      return -ETIMEDOUT;
    }
  }
}

/* One transfer: send [src, src+len) right, receive into [dst, dst+len) from the left,
 * folding with op when reduce is set (dst = in op dst), copying otherwise. */
static int ring_transfer(coll__net_ring_t *r, const uint8_t *src, size_t send_len, uint8_t *dst,
                         size_t recv_len, int reduce, coll_dtype_t dtype, coll_op_t op,
                         double timeout_s, char *err, size_t errlen) {
  uint32_t t = r->next++ & ~RING_CREDIT;
  uint8_t *pool = coll__net_pool(r->net);
  int rc;
  if (t >= 2 && (rc = ring_wait(r, RING_CREDIT, (t - 2) & ~RING_CREDIT, timeout_s, err, errlen)) != 0)
    return rc;
  if ((rc = coll__net_flush(r->net, err, errlen)) != 0) return rc; /* my send slot t % 2 is free */
  if (send_len) memcpy(pool + ring_send_off(r, t), src, send_len);
  /* at least one byte: an empty chunk still carries its note */
  size_t wlen = send_len ? send_len : 1;
  if ((rc = coll__net_write(r->net, r->right, ring_send_off(r, t), ring_recv_off(r, t), wlen, t, err,
                            errlen)) != 0)
    return rc;
  if ((rc = ring_wait(r, 0, t, timeout_s, err, errlen)) != 0) return rc;
  const uint8_t *in = pool + ring_recv_off(r, t);
  size_t es = coll_dtype_size(dtype);
  if (reduce && recv_len) {
    const void *inputs[2] = {in, dst};
    rc = coll_reduce_local(dtype, op, dst, inputs, 2, recv_len / es, 1);
    if (rc) return rc;
  } else if (recv_len) {
    memcpy(dst, in, recv_len);
  }
  return coll__net_write(r->net, r->left, ring_scratch_off(r), ring_scratch_off(r), 1, t | RING_CREDIT,
                         err, errlen);
}

int coll__net_ring_allreduce(coll__net_ring_t *r, coll_dtype_t dtype, coll_op_t op, void *buf,
                             size_t count, double timeout_s, char *err, size_t errlen) {
  size_t es = coll_dtype_size(dtype);
  if (es == 0 || op == COLL_AVG || (count && buf == NULL)) return COLL_EBADARG;
  int n = r->n;
  if (n == 1 || count == 0) return 0;
  size_t base = count / (size_t)n, extra = count % (size_t)n, ce = r->chunk / es;
  size_t longest = base + (extra ? 1 : 0), K = longest ? (longest + ce - 1) / ce : 1;
  uint8_t *b = buf;
#define SEG_START(j) ((size_t)(j) * base + ((size_t)(j) < extra ? (size_t)(j) : extra))
#define SEG_LEN(j) (base + ((size_t)(j) < extra ? 1 : 0))
  for (int phase = 0; phase < 2; phase++) { /* 0: reduce-scatter, 1: allgather */
    for (int s = 0; s < n - 1; s++) {
      int out = ((r->me - s + phase) % n + n) % n, in = ((r->me - s - 1 + phase) % n + n) % n;
      for (size_t k = 0; k < K; k++) {
        size_t o0 = k * ce, i0 = k * ce;
        size_t on = o0 < SEG_LEN(out) ? (SEG_LEN(out) - o0 < ce ? SEG_LEN(out) - o0 : ce) : 0;
        size_t inn = i0 < SEG_LEN(in) ? (SEG_LEN(in) - i0 < ce ? SEG_LEN(in) - i0 : ce) : 0;
        int rc = ring_transfer(r, b + (SEG_START(out) + o0) * es, on * es, b + (SEG_START(in) + i0) * es,
                               inn * es, phase == 0, dtype, op, timeout_s, err, errlen);
        if (rc) return rc;
      }
    }
  }
#undef SEG_START
#undef SEG_LEN
  return coll__net_flush(r->net, err, errlen);
}
