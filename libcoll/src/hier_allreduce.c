/*
 * hier_allreduce.c - allreduce across nodes (hier.h): the reduce across, and the pipelined
 * allreduce where every local rank carries a ring.
 *
 * Up to h->ride bytes (hier.h), the data rides in the meeting: each node folds its ranks'
 * data, every rank folds the nodes' parts in node order (the same bits everywhere).
 *
 * Where nodes differ in ranks (or one ring serves a node): a local allreduce, then the reduce
 * across: the node's result is cut in R slices (the last ones shorter or empty), carrier l
 * reduces slice l around ring l, and a local allgather of the slices gives every local rank
 * the whole.
 *
 * Where every local rank carries a ring (the sliced allreduce): three stages, a local
 * reduce-scatter (local rank l gets slice l of the node's result), ring l reducing slice l
 * across the nodes, a local allgather putting the slices together. The message is padded to L
 * equal slices (pads reduce among themselves and are dropped) and cut in chunks: while this
 * thread drives chunk k around the rings, the node's request engine (coll_start) reduce-scatters
 * chunk k + 1 and allgathers chunk k - 1, so the cores and the link work at once. Every element
 * is still reduced in the same order on every rank, however the message is cut.
 *
 * Whether chunks pay depends on whether the link or the cores bound the call, which no
 * constant knows: node 0's local rank 0 tries 1, 2, 4 and 8 chunks (no piece under
 * HIER_MIN_PIECE) for the first calls of each size class, HIER_TRIES each, keeps the fastest by
 * median, and proposes its choice in the meeting's hint, so every rank cuts alike.
 * HBMCOLL_PIPELINE_CHUNKS fixes the count.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hier.h"

#define HIER_MAX_CHUNKS 255
static const int hier_candidates[4] = {1, 2, 4, 8};

static double hier_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int hier_bits(size_t v) {
  int n = 0;
  while (v) n++, v >>= 1;
  return n;
}

static int hier_allowed(int i, size_t piece) {
  return hier_candidates[i] == 1 || piece / (size_t)hier_candidates[i] >= HIER_MIN_PIECE;
}

int coll__hier_propose(coll__hier_t *h, size_t piece) {
  if (h->cfg.node != 0 || h->local_rank != 0) return 0;
  if (h->fixed_chunks) return h->fixed_chunks;
  int key = hier_bits(piece);
  if (h->tune[key].chosen) return h->tune[key].chosen;
  int fewest = HIER_TRIES;
  for (int i = 0; i < 4; i++)
    if (hier_allowed(i, piece) && h->tune[key].tried[i] < fewest) fewest = h->tune[key].tried[i];
  for (int i = 0; i < 4 && fewest < HIER_TRIES; i++)
    if (hier_allowed(i, piece) && h->tune[key].tried[i] == fewest) return hier_candidates[i];
  int best = 0;
  double best_t = 0;
  for (int i = 0; i < 4; i++) {
    if (!hier_allowed(i, piece)) continue;
    double *t = h->tune[key].times[i], lo = t[0] < t[1] ? t[0] : t[1], hi = t[0] < t[1] ? t[1] : t[0];
    double median = t[2] < lo ? lo : t[2] > hi ? hi : t[2];
    if (!best || median < best_t) best = hier_candidates[i], best_t = median;
  }
  return h->tune[key].chosen = best;
}

void coll__hier_took(coll__hier_t *h, size_t piece, int chunks, double seconds) {
  if (h->cfg.node != 0 || h->local_rank != 0 || h->fixed_chunks) return;
  int key = hier_bits(piece);
  if (h->tune[key].chosen) return;
  for (int i = 0; i < 4; i++)
    if (hier_candidates[i] == chunks && hier_allowed(i, piece) && h->tune[key].tried[i] < HIER_TRIES)
      h->tune[key].times[i][h->tune[key].tried[i]++] = seconds;
}

/* Slice l of buf (of R) around ring l, reduced (root < 0) or from node root's carrier; then a local
 * allgather brings the slices to every rank of the node (the root's node has them all already). */
static int hier_across(coll__hier_t *h, void *buf, size_t count, coll_dtype_t dtype, coll_op_t op, int root,
                       char *err, size_t errlen) {
  size_t es = coll_dtype_size(dtype), R = (size_t)h->cfg.rings, L = (size_t)h->local_size;
  size_t me = (size_t)h->local_rank, S = (count + R - 1) / R;
  size_t lo = me * S < count ? me * S : count, hi = (me + 1) * S < count ? (me + 1) * S : count;
  uint8_t *b = buf;
  int rc = 0;
  if (h->cfg.ring != NULL && hi > lo) /* the same lo, hi on every node: all members call, or none */
    rc = root < 0 ? coll__net_ring_allreduce(h->cfg.ring, dtype, op, b + lo * es, hi - lo, h->cfg.timeout_s, err, errlen)
                  : coll__net_ring_bcast(h->cfg.ring, root, b + lo * es, (hi - lo) * es, h->cfg.timeout_s, err, errlen);
  if (rc || L == 1 || S == 0 || root == h->cfg.node) return rc;
  if (R == L && L * S == count) /* the slices are the buffer's own blocks: gather them in place */
    return coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, S * es, b + me * S * es, b, err, errlen);
  uint8_t *tmp = coll__hier_scratch(h, HIER_SCR_EVERY, L * S * es);
  if (tmp == NULL) return -ENOMEM;
  if (me < R) memcpy(tmp + me * S * es, b + lo * es, (hi - lo) * es);
  rc = coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, S * es, tmp + me * S * es, tmp, err, errlen);
  if (rc == 0) memcpy(b, tmp, count * es);
  return rc;
}

int coll__hier_reduce_across(coll__hier_t *h, void *buf, size_t count, coll_dtype_t dtype, coll_op_t op,
                             char *err, size_t errlen) {
  return hier_across(h, buf, count, dtype, op, -1, err, errlen);
}

int coll__hier_bcast_across(coll__hier_t *h, void *buf, size_t bytes, int node, char *err, size_t errlen) {
  return hier_across(h, buf, bytes, COLL_UINT8, COLL_SUM, node, err, errlen);
}

typedef struct {
  coll__hier_t *h;
  const uint8_t *src;
  uint8_t *piece, *whole;
  size_t es, L, S, c;
  coll_dtype_t dtype;
  coll_op_t op;
} hier_slices_t;

static coll_args_t hier_stage(const hier_slices_t *s, size_t k, int first) {
  size_t a = k * s->c, b = a + s->c < s->S ? a + s->c : s->S, es = s->es, L = s->L;
  coll_args_t x = {.dtype = s->dtype, .op = s->op, .count = b - a};
  if (first) x.kind = COLL_REDUCE_SCATTER, x.send = s->src + L * a * es, x.recv = s->piece + a * es;
  else x.kind = COLL_ALLGATHER, x.send = s->piece + a * es, x.recv = s->whole + L * a * es;
  return x;
}

static int hier_ring(const hier_slices_t *s, size_t k, char *err, size_t errlen) {
  size_t a = k * s->c, b = a + s->c < s->S ? a + s->c : s->S;
  if (s->h->cfg.nodes < 2 || b == a) return 0;
  return coll__net_ring_allreduce(s->h->cfg.ring, s->dtype, s->op, s->piece + a * s->es, b - a,
                                  s->h->cfg.timeout_s, err, errlen);
}

static int hier_run_stage(const hier_slices_t *s, size_t k, int first, char *err, size_t errlen) {
  coll_args_t x = hier_stage(s, k, first);
  int rc = coll_run(s->h->cfg.local, &x);
  return rc ? coll__hier_local_failed(s->h, rc, err, errlen) : 0;
}

/* Wait for every request still out (a failure first ended the node's communicator, so they end). */
static int hier_drain(coll_req_t **reqs, size_t n, int rc) {
  for (size_t i = 0; i < n; i++) {
    if (reqs[i] == NULL) continue;
    int r = coll_req_wait(reqs[i], -1);
    coll_req_free(reqs[i]);
    reqs[i] = NULL;
    if (rc == 0) rc = r;
  }
  return rc;
}

static int hier_overlapped(hier_slices_t *s, size_t chunks, char *err, size_t errlen) {
  coll_req_t *reqs[HIER_MAX_CHUNKS + 1] = {0}; /* [k]: chunk k's allgather; [chunks]: the next reduce-scatter */
  coll_comm_t *local = s->h->cfg.local;
  int rc = hier_run_stage(s, 0, 1, err, errlen);
  for (size_t k = 0; k < chunks && rc == 0; k++) {
    coll_args_t x;
    if (k + 1 < chunks) {
      x = hier_stage(s, k + 1, 1);
      rc = coll_start(local, &x, &reqs[chunks]);
    }
    if (rc == 0) rc = hier_ring(s, k, err, errlen);
    if (rc == 0) {
      x = hier_stage(s, k, 0);
      rc = coll_start(local, &x, &reqs[k]);
    }
    if (rc == 0 && reqs[chunks]) {
      rc = coll_req_wait(reqs[chunks], -1);
      coll_req_free(reqs[chunks]);
      reqs[chunks] = NULL;
    }
  }
  if (rc) { /* end the job's communicator now: the queued stages end with it */
    const char *text = NULL;
    if (coll_comm_error(local, &text) != 0) coll__hier_local_failed(s->h, rc, err, errlen);
    coll__hier_fail(s->h, rc, err);
  }
  return hier_drain(reqs, chunks + 1, rc);
}

static int hier_sliced(coll__hier_t *h, const void *send, void *out, size_t count, coll_dtype_t dtype, coll_op_t op,
                       int chunks, char *err, size_t errlen) {
  size_t es = coll_dtype_size(dtype), L = (size_t)h->local_size, S = (count + L - 1) / L;
  hier_slices_t s = {.h = h, .src = send, .es = es, .L = L, .S = S, .dtype = dtype, .op = op};
  const uint8_t *in = send;
  uint8_t *o = out;
  int overlap = in != o && in < o + count * es && o < in + count * es;
  if (L * S != count || overlap) { /* pad to L equal slices; a partly overlapping send is copied */
    uint8_t *padded = coll__hier_scratch(h, HIER_SCR_EVERY, L * S * es);
    if (padded == NULL) return -ENOMEM;
    memcpy(padded, send, count * es);
    memset(padded + count * es, 0, (L * S - count) * es);
    s.src = padded;
  }
  s.piece = coll__hier_scratch(h, HIER_SCR_PIECE, S * es + 64);
  s.whole = L * S == count ? o : coll__hier_scratch(h, HIER_SCR_MINE, L * S * es);
  if (s.piece == NULL || s.whole == NULL) return -ENOMEM;
  size_t want = chunks < 1 ? 1 : (size_t)chunks;
  s.c = S ? (S + want - 1) / want : 1;
  size_t n = S ? (S + s.c - 1) / s.c : 1;
  int rc = 0;
  if (h->cfg.nodes < 2 || n == 1) {
    for (size_t k = 0; k < n && rc == 0; k++) {
      rc = hier_run_stage(&s, k, 1, err, errlen);
      if (rc == 0) rc = hier_ring(&s, k, err, errlen);
      if (rc == 0) rc = hier_run_stage(&s, k, 0, err, errlen);
    }
  } else {
    rc = hier_overlapped(&s, n, err, errlen);
  }
  if (rc == 0 && s.whole != o) memcpy(o, s.whole, count * es);
  return rc;
}

int coll__hier_allreduce_met(coll__hier_t *h, const void *send, void *out, size_t count, coll_dtype_t dtype,
                             coll_op_t op, char *err, size_t errlen) {
  if (h->sliced) {
    h->algorithm = "sliced";
    return hier_sliced(h, send, out, count, dtype, op, h->hint, err, errlen);
  }
  h->algorithm = "rings";
  int rc = 0;
  if (h->local_size > 1)
    rc = coll__hier_local(h, COLL_ALLREDUCE, dtype, op, 0, count, send, out, err, errlen);
  else if (out != send)
    memmove(out, send, count * coll_dtype_size(dtype)); /* alone on its node: nothing to reduce there */
  return rc ? rc : coll__hier_reduce_across(h, out, count, dtype, op, err, errlen);
}

int coll__hier_allreduce(coll__hier_t *h, const coll_args_t *a, void *out, char *err, size_t errlen) {
  size_t es = coll_dtype_size(a->dtype), bytes = a->count * es;
  coll_op_t base = a->op == COLL_AVG ? COLL_SUM : a->op;
  int rc;
  if (bytes <= h->ride) {
    const uint8_t *parts;
    rc = coll__hier_meet(h, a, a->send, bytes, HIER_PART_FOLD, 0, 0, &parts, err, errlen);
    if (rc) return rc;
    for (int k = 0; k < h->cfg.nodes; k++) h->inputs[k] = parts + (size_t)k * h->stride;
    rc = coll_reduce_local(a->dtype, base, out, h->inputs, (size_t)h->cfg.nodes, a->count, 1);
    h->algorithm = "meeting";
  } else {
    double t0 = hier_now();
    size_t piece = (bytes + (size_t)h->local_size - 1) / (size_t)h->local_size;
    int proposal = h->sliced ? coll__hier_propose(h, piece) : 0;
    rc = coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, (uint8_t)proposal, NULL, err, errlen);
    if (rc == 0) rc = coll__hier_allreduce_met(h, a->send, out, a->count, a->dtype, base, err, errlen);
    if (rc == 0 && h->sliced) coll__hier_took(h, piece, h->hint, hier_now() - t0);
  }
  if (rc == 0 && a->op == COLL_AVG) {
    const void *in[1] = {out};
    rc = coll_reduce_local(a->dtype, COLL_AVG, out, in, 1, a->count, (size_t)h->cfg.size);
  }
  return rc;
}
