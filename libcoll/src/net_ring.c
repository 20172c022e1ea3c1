/*
 * net_ring.c - allreduce between nodes around a ring of bridge endpoints (net_ring.h).
 *
 * The message is cut into n segments (the first count % n one element longer), each
 * segment into K chunks of at most one slot, K the same for every segment so that all
 * members take the same steps. Reduce-scatter: at step s member m sends segment m - s to
 * its right and folds segment m - s - 1, arriving from its left, into its own buffer:
 * after n - 1 steps it holds segment m + 1 reduced over all members, computed by it alone (a
 * reduce-scatter alone shifts the numbering by one, so that member m ends with segment m).
 * Allgather: n - 1 more steps pass the finished segments on, copied, not reduced. So every
 * member ends with the same bits, for floats too. An allgather alone is that second phase
 * with each member starting from its own segment.
 *
 * One transfer (transfer number t, counted on across collectives): wait for the credit of
 * t - 2 (the right neighbour has consumed slot t % 2), wait until my write of t - 2 left my
 * send slot, stage the chunk in send slot t % 2 (or, where the provider writes from any
 * memory, tcp, from the caller's buffer as it is: one copy less) and write it into the right
 * neighbour's receive slot t % 2 with the note t; then wait for the left neighbour's note t, take its
 * chunk out of my receive slot t % 2 and send the left neighbour credit t. Notes can arrive
 * in any order, so the last few of each kind are kept by number.
 *
 * Two members and a message of up to one slot: an exchange instead (ring_exchange).
 * Small allgathers (every call's meeting across nodes) take the eager path, net_eager.c.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "net_ring_int.h"

static size_t ring_send_off(const coll__net_ring_t *r, uint32_t t) { return (t & 1) * r->chunk; }
static size_t ring_recv_off(const coll__net_ring_t *r, uint32_t t) { return (2 + (t & 1)) * r->chunk; }
static size_t ring_scratch_off(const coll__net_ring_t *r) { return 4 * r->chunk + r->hop_area; }

int coll__net_ring_make(coll__net_t *net, int n, int me, int left, int right,
                        coll__net_ring_t **ring_p) {
  size_t pool = coll__net_pool_bytes(net);
  if (n < 1 || me < 0 || me >= n || pool < 65536) return COLL_EBADARG;
  coll__net_ring_t *r = calloc(1, sizeof *r);
  if (r == NULL || (r->reach = malloc((size_t)n * sizeof *r->reach)) == NULL) {
    free(r);
    return -ENOMEM;
  }
  r->net = net, r->n = n, r->me = me, r->left = left, r->right = right;
  r->hop_area = (pool / 8) & ~(size_t)127;
  r->chunk = ((pool - RING_SCRATCH - r->hop_area) / 4) & ~(size_t)63;
  for (int m = 0; m < n; m++) r->reach[m] = -1;
  memset(r->hop_seen, 0xff, sizeof r->hop_seen);
  memset(r->ready_seen, 0xff, sizeof r->ready_seen);
  r->cur_left = left, r->cur_right = right;
  r->direct = coll__net_any_source(net);
  memset(r->data_seen, 0xff, sizeof r->data_seen);
  memset(r->credit_seen, 0xff, sizeof r->credit_seen);
  *ring_p = r;
  return 0;
}

void coll__net_ring_free(coll__net_ring_t *r) {
  if (r) free(r->reach);
  free(r);
}

int coll__net_ring_reach(coll__net_ring_t *r, int member, int peer) {
  if (member < 0 || member >= r->n) return COLL_EBADARG;
  r->reach[member] = peer;
  return 0;
}

int coll__net_ring_members(const coll__net_ring_t *r) { return r->n; }

size_t coll__net_ring_slot_bytes(const coll__net_ring_t *r) { return r->chunk; }

static double ring_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void ring_keep(coll__net_ring_t *r, uint32_t note) {
  uint32_t num = note & RING_NUM;
  if (note == RING_BYE) {
    r->byes++;
    return;
  }
  if ((note & RING_HOP) && (note & RING_CREDIT)) r->ready_seen[num % RING_SEEN] = num;
  else if (note & RING_HOP) r->hop_seen[num % HOP_SEEN] = num;
  else ((note & RING_CREDIT) ? r->credit_seen : r->data_seen)[num % RING_SEEN] = num;
}

/* What each kind of wait (net_ring_int.h) waits for, said when it fails. */
static const char *const ring_waits_for[] = {"data from the previous node's rank",
                                             "credit from the next node's rank",
                                             "my write to the next node's rank to complete",
                                             "blocks from another node's rank",
                                             "another node's rank to be ready",
                                             "my writes of blocks to another node's rank to complete",
                                             "the other nodes' ranks' goodbyes"};

static int ring_ready(const coll__net_ring_t *r, int what, uint32_t t) {
  if (what == RING_SENT) return r->sent[t & 1] >= r->staged[t & 1];
  if (what == RING_HOP_SENT) return r->hop_sent[t & 1] >= r->hop_staged[t & 1];
  if (what == RING_HOP_OF) return r->hop_seen[t % HOP_SEEN] == t;
  if (what == RING_READY_OF) return r->ready_seen[t % RING_SEEN] == t;
  if (what == RING_BYES) return r->byes >= r->n - 1;
  return (what == RING_DATA ? r->data_seen : r->credit_seen)[t % RING_SEEN] == t;
}

/* Until `what` for transfer t: every note that arrives meanwhile is kept by number. Between
 * empty polls the bridge spins a little, then blocks in the kernel (coll__net_idle); after a
 * block, and every few hundred polls, the interrupt and the deadline are looked at. */
int coll__net_ring_wait(coll__net_ring_t *r, int what, uint32_t t, double timeout_s, char *err, size_t errlen) {
  double until = timeout_s > 0 ? ring_now() + timeout_s : 0, since = 0;
  for (unsigned spins = 0; !ring_ready(r, what, t); spins++) {
    uint32_t note;
    int rc = coll__net_poll(r->net, &note, err, errlen);
    if (rc < 0) return rc;
    if (rc == 1) {
      ring_keep(r, note);
      spins = 0, since = 0;
      continue;
    }
    int slept = coll__net_idle(r->net, &since, until);
    if ((slept || (spins & 255) == 0) && coll__net_interrupted(r->net)) {
      snprintf(err, errlen, "interrupted while waiting for %s (transfer %u)", ring_waits_for[what], (unsigned)t);
      return COLL_EINTERRUPTED;
    }
    if (until && (slept || (spins & 1023) == 0) && ring_now() > until) {
      snprintf(err, errlen, "waited %.0f s for %s (transfer %u)", timeout_s, ring_waits_for[what], (unsigned)t);
      return -ETIMEDOUT;
    }
  }
  return 0;
}

/* Transfer t's two halves: what I send right and what I take from the left. */
typedef struct {
  const uint8_t *src;
  uint8_t *dst;
  size_t send_len, recv_len;
  int reduce;
} ring_step_t;

/* Post transfer t: once the right neighbour gave the credit of t - 2 and my write of t - 2
 * left send slot t % 2, stage the chunk there and write it into its receive slot t % 2. */
static int ring_post(coll__net_ring_t *r, uint32_t t, const ring_step_t *st, double timeout_s,
                     char *err, size_t errlen) {
  uint8_t *pool = coll__net_pool(r->net);
  int rc;
  if (t >= 2 && ((t - r->fresh) & RING_NUM) >= 2 &&
      (rc = coll__net_ring_wait(r, RING_CREDIT_OF, (t - 2) & RING_NUM, timeout_s, err, errlen)) != 0)
    return rc;
  if ((rc = coll__net_ring_wait(r, RING_SENT, t, timeout_s, err, errlen)) != 0) return rc;
  r->staged[t & 1]++;
  if (r->direct && st->send_len)
    return coll__net_write_from(r->net, r->right, st->src, st->send_len, ring_recv_off(r, t), t,
                                &r->sent[t & 1], err, errlen);
  if (st->send_len) memcpy(pool + ring_send_off(r, t), st->src, st->send_len);
  /* at least one byte: an empty chunk still carries its note */
  return coll__net_write(r->net, r->right, ring_send_off(r, t), ring_recv_off(r, t),
                         st->send_len ? st->send_len : 1, t, &r->sent[t & 1], err, errlen);
}

/* Take transfer t: wait for the left neighbour's note t, fold (dst = in op dst, or dst op in
 * with mine_first) or copy its chunk out of receive slot t % 2, and give it the credit of t. */
static int ring_take(coll__net_ring_t *r, uint32_t t, const ring_step_t *st, coll_dtype_t dtype,
                     coll_op_t op, int mine_first, double timeout_s, char *err, size_t errlen) {
  int rc = coll__net_ring_wait(r, RING_DATA, t, timeout_s, err, errlen);
  if (rc) return rc;
  const uint8_t *in = coll__net_pool(r->net) + ring_recv_off(r, t);
  if (st->reduce && st->recv_len) {
    const void *inputs[2] = {mine_first ? st->dst : in, mine_first ? in : st->dst};
    if ((rc = coll_reduce_local(dtype, op, st->dst, inputs, 2, st->recv_len / coll_dtype_size(dtype), 1)) != 0)
      return rc;
  } else if (st->recv_len) {
    memcpy(st->dst, in, st->recv_len);
  }
  return coll__net_write(r->net, r->left, ring_scratch_off(r), ring_scratch_off(r), 1, t | RING_CREDIT,
                         NULL, err, errlen);
}

/* Before transfer t0 with neighbours other than the last run's: a credit says that the slot's
 * last reader took what was there, but that reader was the old right neighbour, not the new
 * one. So each member tells its new left that its slots are free from t0 on (all it received
 * before is taken), and waits for the same word from its new right before writing to it. */
static int ring_neighbours(coll__net_ring_t *r, uint32_t t0, double timeout_s, char *err, size_t errlen) {
  if (r->left == r->cur_left && r->right == r->cur_right) return 0;
  int rc = coll__net_write(r->net, r->left, ring_scratch_off(r), ring_scratch_off(r), 1,
                           t0 | RING_HOP | RING_CREDIT, NULL, err, errlen);
  if (rc == 0) rc = coll__net_ring_wait(r, RING_READY_OF, t0, timeout_s, err, errlen);
  if (rc) return rc;
  r->cur_left = r->left, r->cur_right = r->right, r->fresh = t0;
  return 0;
}

/* The i-th transfer of a run that starts at phase `first` (0: reduce-scatter, 1: allgather)
 * over count elements of es bytes: step s of phase p (counted from the run's first), chunk k
 * of the segments it moves. Member m sends segment m - s + p + shift, so in an allgather alone
 * it starts with its own segment m; after a reduce-scatter it owns m + 1 + shift (shift n - 1:
 * its own). */
static ring_step_t ring_plan(const coll__net_ring_t *r, uint8_t *b, size_t count, size_t es, size_t K, size_t ce,
                             int first, size_t shift, size_t i) {
  size_t n = (size_t)r->n, base = count / n, extra = count % n;
  size_t k = i % K, s = (i / K) % (n - 1), p = i / (K * (n - 1));
  size_t out = ((size_t)r->me + n - s + p + shift) % n, in = ((size_t)r->me + 2 * n - s - 1 + p + shift) % n;
  size_t out_len = base + (out < extra), in_len = base + (in < extra);
  size_t out_at = out * base + (out < extra ? out : extra), in_at = in * base + (in < extra ? in : extra);
  size_t o = k * ce < out_len ? (out_len - k * ce < ce ? out_len - k * ce : ce) : 0;
  size_t g = k * ce < in_len ? (in_len - k * ce < ce ? in_len - k * ce : ce) : 0;
  ring_step_t st = {b + (out_at + k * ce) * es, b + (in_at + k * ce) * es, o * es, g * es, first + p == 0};
  return st;
}

/* The transfers of `phases` phases from phase `first` on, each member's segments cut in K
 * chunks, segment numbers shifted by `shift` (ring_plan). */
static int ring_run(coll__net_ring_t *r, coll_dtype_t dtype, coll_op_t op, void *buf, size_t count,
                    int first, int phases, size_t shift, double timeout_s, char *err, size_t errlen) {
  size_t es = coll_dtype_size(dtype);
  size_t n = (size_t)r->n, ce = r->chunk / es, longest = count / n + (count % n != 0);
  size_t K = (longest + ce - 1) / ce, T = (size_t)phases * (n - 1) * K;
  if (K) ce = (longest + K - 1) / K; /* chunks of one size: no short last chunk costing a whole step */
  /* With two chunks or more per step, transfer i + 1 never sends what transfer i brings
   * (that goes out K transfers later), so it is posted first and the link stays busy while
   * the chunk that came in is folded. */
  int ahead = K >= 2;
  coll__net_set_timeout(r->net, timeout_s);
  uint32_t t0 = r->next;
  r->next = (uint32_t)(t0 + T) & RING_NUM;
  ring_step_t st = ring_plan(r, buf, count, es, K, ce, first, shift, 0);
  int rc = ring_neighbours(r, t0, timeout_s, err, errlen);
  if (rc == 0) rc = ring_post(r, t0 & RING_NUM, &st, timeout_s, err, errlen);
  for (size_t i = 0; rc == 0 && i < T; i++) {
    uint32_t t = (uint32_t)(t0 + i) & RING_NUM, u = (t + 1) & RING_NUM;
    ring_step_t next = i + 1 < T ? ring_plan(r, buf, count, es, K, ce, first, shift, i + 1) : st;
    if (ahead && i + 1 < T) rc = ring_post(r, u, &next, timeout_s, err, errlen);
    /* the allgather overwrites what the reduce-scatter sent K(n-1) transfers before: written
     * straight from here, that write must have left first (at most two are in flight) */
    if (rc == 0 && r->direct && first == 0 && i >= K * (n - 1))
      rc = coll__net_ring_wait(r, RING_SENT, (uint32_t)(t - K * (n - 1)) & RING_NUM, timeout_s, err, errlen);
    if (rc == 0) rc = ring_take(r, t, &st, dtype, op, 0, timeout_s, err, errlen);
    if (rc == 0 && !ahead && i + 1 < T) rc = ring_post(r, u, &next, timeout_s, err, errlen);
    st = next;
  }
  return rc ? rc : coll__net_flush(r->net, err, errlen);
}

/* Two members and a message of up to one slot: each sends the other its whole message and folds
 * in what comes back, member 0's elements first. The same bytes cross the link as the ring's
 * reduce-scatter and allgather move, in one step instead of two. Both members compute the same
 * IEEE operations on the same inputs, so they get the same bits as long as both run the same
 * code with the default floating-point mode (as the ranks of a node do); float16 and bfloat16,
 * whose kernels depend on the CPU's features, keep the ring, where one member computes each
 * element. The fold waits until my write left (it may be written straight from buf). */
static int ring_exchange(coll__net_ring_t *r, coll_dtype_t dtype, coll_op_t op, uint8_t *b, size_t count,
                         double timeout_s, char *err, size_t errlen) {
  size_t bytes = count * coll_dtype_size(dtype);
  coll__net_set_timeout(r->net, timeout_s);
  uint32_t t = r->next;
  r->next = (t + 1) & RING_NUM;
  ring_step_t out = {b, NULL, bytes, 0, 0}, in = {NULL, b, 0, bytes, 1};
  int rc = ring_neighbours(r, t, timeout_s, err, errlen);
  if (rc == 0) rc = ring_post(r, t, &out, timeout_s, err, errlen);
  if (rc == 0 && r->direct) rc = coll__net_ring_wait(r, RING_SENT, t, timeout_s, err, errlen);
  if (rc == 0) rc = ring_take(r, t, &in, dtype, op, r->me == 0, timeout_s, err, errlen);
  return rc ? rc : coll__net_flush(r->net, err, errlen);
}

static int ring_exchanges(const coll__net_ring_t *r, coll_dtype_t dtype, size_t count) {
  return r->n == 2 && dtype != COLL_FLOAT16 && dtype != COLL_BFLOAT16 && count <= r->chunk / coll_dtype_size(dtype);
}

int coll__net_ring_allreduce(coll__net_ring_t *r, coll_dtype_t dtype, coll_op_t op, void *buf,
                             size_t count, double timeout_s, char *err, size_t errlen) {
  if (coll_dtype_size(dtype) == 0 || op == COLL_AVG || (count && buf == NULL)) return COLL_EBADARG;
  if (r->n == 1 || count == 0) return 0;
  if (ring_exchanges(r, dtype, count)) return ring_exchange(r, dtype, op, buf, count, timeout_s, err, errlen);
  return ring_run(r, dtype, op, buf, count, 0, 2, 0, timeout_s, err, errlen);
}

int coll__net_ring_reduce_scatter(coll__net_ring_t *r, coll_dtype_t dtype, coll_op_t op, void *buf,
                                  size_t count, double timeout_s, char *err, size_t errlen) {
  if (coll_dtype_size(dtype) == 0 || op == COLL_AVG || (count && buf == NULL)) return COLL_EBADARG;
  if (r->n == 1 || count == 0) return 0;
  return ring_run(r, dtype, op, buf, count, 0, 1, (size_t)r->n - 1, timeout_s, err, errlen);
}

int coll__net_ring_shift(coll__net_ring_t *r, int j, const void *src, void *dst, size_t bytes, double timeout_s,
                         char *err, size_t errlen) {
  int n = r->n, to = ((r->me + j) % n + n) % n, from = ((r->me - j) % n + n) % n;
  if ((bytes && (src == NULL || dst == NULL)) || (to != r->me && (r->reach[to] < 0 || r->reach[from] < 0)))
    return COLL_EBADARG;
  if (to == r->me || bytes == 0) {
    if (bytes) memmove(dst, src, bytes);
    return 0;
  }
  /* the ring's transfers with other neighbours: the numbers and slots go on as they were, and
   * ring_neighbours makes sure the new right's slots are free */
  int left = r->left, right = r->right, rc = 0;
  r->left = r->reach[from], r->right = r->reach[to];
  size_t K = (bytes + r->chunk - 1) / r->chunk;
  uint32_t t0 = r->next;
  r->next = (uint32_t)(t0 + K) & RING_NUM;
  coll__net_set_timeout(r->net, timeout_s);
  rc = ring_neighbours(r, t0, timeout_s, err, errlen);
  for (size_t i = 0; rc == 0 && i <= K; i++) { /* post transfer i, then take transfer i - 1 */
    if (i < K) {
      size_t len = bytes - i * r->chunk < r->chunk ? bytes - i * r->chunk : r->chunk;
      ring_step_t st = {(const uint8_t *)src + i * r->chunk, NULL, len, 0, 0};
      rc = ring_post(r, (uint32_t)(t0 + i) & RING_NUM, &st, timeout_s, err, errlen);
    }
    if (rc == 0 && i > 0) {
      size_t len = bytes - (i - 1) * r->chunk < r->chunk ? bytes - (i - 1) * r->chunk : r->chunk;
      ring_step_t st = {NULL, (uint8_t *)dst + (i - 1) * r->chunk, 0, len, 0};
      rc = ring_take(r, (uint32_t)(t0 + i - 1) & RING_NUM, &st, COLL_UINT8, COLL_SUM, 0, timeout_s, err, errlen);
    }
  }
  if (rc == 0) rc = coll__net_flush(r->net, err, errlen);
  r->left = left, r->right = right;
  return rc;
}

/* A chain from the root around the ring, chunk by chunk: each member takes transfer t from its left
 * and passes it on; the last member passes an empty note to the root, so every link carries every
 * number and the credits go on as in the other runs. The root posts one transfer ahead of taking
 * those notes, so it never waits for a chunk to go round before sending the next. */
int coll__net_ring_bcast(coll__net_ring_t *r, int root, void *buf, size_t bytes, double timeout_s, char *err,
                         size_t errlen) {
  if ((bytes && buf == NULL) || root < 0 || root >= r->n) return COLL_EBADARG;
  if (r->n == 1 || bytes == 0) return 0;
  int pos = (r->me - root + r->n) % r->n, last = pos == r->n - 1;
  size_t K = (bytes + r->chunk - 1) / r->chunk, c = (bytes + K - 1) / K; /* chunks of one size */
  uint8_t *b = buf;
  coll__net_set_timeout(r->net, timeout_s);
  uint32_t t0 = r->next;
  r->next = (uint32_t)(t0 + K) & RING_NUM;
  int rc = ring_neighbours(r, t0, timeout_s, err, errlen);
  for (size_t i = 0; rc == 0 && i <= K; i++) {
    uint32_t t = (uint32_t)(t0 + i) & RING_NUM;
    size_t at = i * c, len = i < K ? (bytes - at < c ? bytes - at : c) : 0;
    ring_step_t st = {b + at, b + at, last ? 0 : len, len, 0}, note = {NULL, NULL, 0, 0, 0};
    if (pos > 0 && i < K) rc = ring_take(r, t, &st, COLL_UINT8, COLL_SUM, 0, timeout_s, err, errlen);
    if (rc == 0 && i < K) rc = ring_post(r, t, &st, timeout_s, err, errlen);
    if (rc == 0 && pos == 0 && i > 0)
      rc = ring_take(r, (t - 1) & RING_NUM, &note, COLL_UINT8, COLL_SUM, 0, timeout_s, err, errlen);
  }
  return rc ? rc : coll__net_flush(r->net, err, errlen);
}

size_t coll__net_ring_eager_block(const coll__net_ring_t *r) {
  return r->hop_area / 2 / (size_t)r->n;
}

int coll__net_ring_allgather_used(coll__net_ring_t *r, void *buf, size_t block, size_t used, size_t own,
                                  double timeout_s, char *err, size_t errlen) {
  if ((block && buf == NULL) || used > block || own > used) return COLL_EBADARG;
  if (r->n == 1 || block == 0) return 0;
  if (used == 0) used = 1; /* a step carries at least a byte, as the ring's empty chunks do */
  if (own == 0) own = 1;
  int reached = block <= coll__net_ring_eager_block(r);
  for (int m = 0; reached && m < r->n; m++) reached = m == r->me || r->reach[m] >= 0;
  if (reached) return coll__net_eager_allgather(r, buf, block, used, own, timeout_s, err, errlen);
  return ring_run(r, COLL_UINT8, COLL_SUM, buf, block * (size_t)r->n, 1, 1, 0, timeout_s, err, errlen);
}

int coll__net_ring_allgather(coll__net_ring_t *r, void *buf, size_t block, double timeout_s, char *err,
                             size_t errlen) {
  return coll__net_ring_allgather_used(r, buf, block, block, block, timeout_s, err, errlen);
}

/* Every member writes a goodbye to every other and waits for theirs, then for its own writes: a
 * member's goodbye comes behind everything it wrote before (one connection keeps the order), so once
 * all came nothing more will be written into my pool, and none of my writes is left to complete. */
int coll__net_ring_goodbye(coll__net_ring_t *r, double timeout_s, char *err, size_t errlen) {
  int rc = 0;
  coll__net_set_timeout(r->net, timeout_s);
  for (int m = 0; m < r->n && rc == 0; m++) {
    if (m == r->me) continue;
    if (r->reach[m] < 0) return COLL_EBADARG;
    rc = coll__net_write(r->net, r->reach[m], ring_scratch_off(r), ring_scratch_off(r), 1, RING_BYE, NULL, err,
                         errlen);
  }
  if (rc == 0) rc = coll__net_ring_wait(r, RING_BYES, 0, timeout_s, err, errlen);
  return rc ? rc : coll__net_flush(r->net, err, errlen);
}
