/*
 * coll_ops.h - one collective as the C tests run it (header-only, after harness.h): inputs
 * derived from (salt, rank, block, index) so a stale or misplaced chunk never passes, the
 * buffers (private or in the arena; out of place, in place, send == recv), the call and the
 * check of every byte; spawn() runs a rank function in P forked ranks and lists every rank
 * on failure. Shared by test_collectives.c, test_arena.c, test_requests.c and test_split.c.
 */
#ifndef HBMCOLL_TESTS_C_COLL_OPS_H
#define HBMCOLL_TESTS_C_COLL_OPS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "coll.h"

/* Runs fn in `size` forked ranks with the "NAME=VALUE" strings of env set
 * (spawn_raw) and records a pass if every rank exited with status 0 before
 * timeout_s. Returns 0 if it passed. Its FAIL line lists every rank (up to
 * MAX_RANKS of them) rather than record()'s bounded reason. */
static inline int spawn(const char *name, int size, double timeout_s, const char *const *env, rank_fn fn,
                 void *arg) {
  int status[MAX_RANKS];
  double t0 = now_s();
  int timed_out = spawn_raw(size, timeout_s, env, fn, arg, status);
  int ok = !timed_out;
  for (int r = 0; r < size; r++)
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) ok = 0;
  double dt = now_s() - t0;
  if (ok) {
    test_passed++;
    printf("ok   %-44s P=%d  %.1f s\n", name, size, dt);
  } else {
    test_failed++;
    printf("FAIL %-44s P=%d  %.1f s%s:", name, size, dt, timed_out ? " (timed out, killed)" : "");
    for (int r = 0; r < size; r++) {
      if (WIFSIGNALED(status[r])) printf(" r%d=sig%d", r, WTERMSIG(status[r]));
      else if (WEXITSTATUS(status[r])) printf(" r%d=exit%d", r, WEXITSTATUS(status[r]));
    }
    printf("\n");
  }
  fflush(stdout);
  return ok ? 0 : 1;
}

static inline size_t env_slot_bytes(void) {
  const char *s = getenv("HBMCOLL_SLOT_BYTES");
  return s && *s ? (size_t)strtoull(s, NULL, 10) : (size_t)256 << 10;
}

/* ---- data: derived from (salt, rank, block, index) ---------------------- */

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}

static inline uint8_t pat(unsigned salt, int rank, size_t block, size_t j) {
  return (uint8_t)mix((uint64_t)j * 0x9E3779B97F4A7C15ull + ((uint64_t)salt << 44) +
                      ((uint64_t)rank << 28) + block * 0x632BE59BD9B4E019ull);
}

typedef struct {
  coll_dtype_t dtype;
  coll_op_t op;
  int64_t lo, hi; /* input values are integers in [lo, hi]: exact in every dtype */
} rcase_t;

static const rcase_t rcases[] = {
    {COLL_INT32, COLL_SUM, -1000, 1000},       {COLL_FLOAT64, COLL_MAX, -1000, 1000},
    {COLL_INT64, COLL_MIN, -1000000, 1000000}, {COLL_UINT8, COLL_PROD, 1, 3},
    {COLL_FLOAT64, COLL_AVG, -1000, 1000},     {COLL_FLOAT32, COLL_SUM, -1000, 1000},
    {COLL_INT8, COLL_MAX, -100, 100},
};
#define NRCASES ((int)(sizeof rcases / sizeof rcases[0]))

static inline int64_t rval(const rcase_t *rc, unsigned salt, int rank, size_t g) {
  uint64_t span = (uint64_t)(rc->hi - rc->lo + 1);
  return rc->lo + (int64_t)(mix((uint64_t)g * 0x9E3779B97F4A7C15ull + ((uint64_t)salt << 44) +
                                ((uint64_t)rank << 28) + 12345) % span);
}

static inline void put(coll_dtype_t dt, void *b, size_t i, int64_t v) {
  switch (dt) {
  case COLL_INT8: ((int8_t *)b)[i] = (int8_t)v; break;
  case COLL_UINT8: ((uint8_t *)b)[i] = (uint8_t)v; break;
  case COLL_INT32: ((int32_t *)b)[i] = (int32_t)v; break;
  case COLL_INT64: ((int64_t *)b)[i] = v; break;
  case COLL_FLOAT32: ((float *)b)[i] = (float)v; break;
  case COLL_FLOAT64: ((double *)b)[i] = (double)v; break;
  default: abort();
  }
}

static inline double get(coll_dtype_t dt, const void *b, size_t i) {
  switch (dt) {
  case COLL_INT8: return ((const int8_t *)b)[i];
  case COLL_UINT8: return ((const uint8_t *)b)[i];
  case COLL_INT32: return ((const int32_t *)b)[i];
  case COLL_INT64: return (double)((const int64_t *)b)[i];
  case COLL_FLOAT32: return ((const float *)b)[i];
  case COLL_FLOAT64: return ((const double *)b)[i];
  default: abort();
  }
}

/* op over ranks 0..P-1 in order, as the library promises */
static inline double rref(const rcase_t *rc, unsigned salt, int P, size_t g) {
  int64_t acc = rval(rc, salt, 0, g);
  for (int q = 1; q < P; q++) {
    int64_t v = rval(rc, salt, q, g);
    switch (rc->op) {
    case COLL_SUM:
    case COLL_AVG: acc += v; break;
    case COLL_PROD: acc = (int64_t)(((uint64_t)acc * (uint64_t)v) & 0xff); break; /* uint8 only */
    case COLL_MIN: acc = v < acc ? v : acc; break;
    case COLL_MAX: acc = v > acc ? v : acc; break;
    default: abort();
    }
  }
  if (rc->op == COLL_AVG) return (double)acc / (double)P; /* float64 only */
  if (rc->op == COLL_PROD) return (double)(acc & 0xff);
  return (double)acc;
}

/* ---- one collective: prepare, run, verify ----------------------------------- */

enum { MODE_OUT = 0, MODE_IN = 1, MODE_ALIAS = 2 };
enum { AR_SEND = 1, AR_RECV = 2 };
static const char *const mode_names[] = {"out-of-place", "in-place", "send==recv"};

static inline int kind_uses_root(coll_kind_t k) {
  return k == COLL_BCAST || k == COLL_GATHER || k == COLL_SCATTER || k == COLL_REDUCE;
}
static inline int kind_reduces(coll_kind_t k) {
  return k == COLL_REDUCE || k == COLL_ALLREDUCE || k == COLL_REDUCE_SCATTER;
}

typedef struct {
  coll_kind_t kind;
  int root, mode, arena, rcase;
  coll_dtype_t dtype; /* data movement kinds */
  size_t count;
  unsigned salt;
  const char *algo; /* allreduce/reduce: forced algorithm, NULL = auto */
  /* filled by op_prepare */
  coll_args_t a;
  uint8_t *sbuf, *rbuf; /* owned */
  int s_in_arena, r_in_arena;
  uint8_t *send_copy; /* out of place: send must be unchanged */
  size_t send_bytes;
} op_t;

static inline void op_describe(const op_t *o, int rank, char *buf, size_t len) {
  snprintf(buf, len, "rank %d: %s count=%zu dtype=%s%s%s root=%d %s arena=%d algo=%s salt=%u", rank,
           coll_kind_name(o->kind), o->count, coll_dtype_name(o->a.dtype),
           kind_reduces(o->kind) ? " op=" : "", kind_reduces(o->kind) ? coll_op_name(o->a.op) : "",
           o->root, mode_names[o->mode], o->arena, o->algo ? o->algo : "auto", o->salt);
}

static inline uint8_t *op_alloc(coll_comm_t *c, size_t bytes, int arena, int *in_arena) {
  *in_arena = 0;
  if (arena) {
    void *p = NULL;
    int rc = coll_arena_alloc(c, bytes, 64, &p);
    if (rc == 0) {
      *in_arena = 1;
      return p;
    }
    fprintf(stderr, "coll_arena_alloc(%zu): %s\n", bytes, coll_err_name(rc));
    exit(3);
  }
  uint8_t *p = malloc(bytes ? bytes : 1);
  if (p == NULL) exit(3);
  return p;
}

static inline void op_prepare(coll_comm_t *c, op_t *o) {
  int P = coll_comm_size(c), me = coll_comm_rank(c);
  int is_root = me == o->root;
  coll_kind_t k = o->kind;
  const rcase_t *rc = &rcases[o->rcase];
  coll_dtype_t dt = kind_reduces(k) ? rc->dtype : o->dtype;
  size_t es = coll_dtype_size(dt), n = o->count, nb = n * es, Pn = (size_t)P * nb;
  size_t sbytes = 0, rbytes = 0;
  switch (k) {
  case COLL_BARRIER: break;
  case COLL_BCAST: rbytes = nb; break;
  case COLL_GATHER: sbytes = nb, rbytes = is_root ? Pn : 0; break;
  case COLL_SCATTER: sbytes = is_root ? Pn : 0, rbytes = nb; break;
  case COLL_ALLGATHER: sbytes = nb, rbytes = Pn; break;
  case COLL_REDUCE: sbytes = nb, rbytes = is_root ? nb : 0; break;
  case COLL_ALLREDUCE: sbytes = rbytes = nb; break;
  case COLL_REDUCE_SCATTER: sbytes = Pn, rbytes = nb; break;
  case COLL_ALLTOALL: sbytes = rbytes = Pn; break;
  default: abort();
  }
  memset(&o->a, 0, sizeof o->a);
  o->a.kind = k;
  o->a.dtype = dt;
  o->a.op = kind_reduces(k) ? rc->op : COLL_SUM;
  o->a.root = o->root;
  o->a.count = n;
  o->sbuf = o->rbuf = o->send_copy = NULL;
  o->s_in_arena = o->r_in_arena = 0;
  uint8_t *send = NULL, *recv = NULL;
  int mode = o->mode;
  if (mode == MODE_IN) {
    switch (k) {
    case COLL_GATHER:
      if (!is_root) mode = MODE_OUT;
      else o->rbuf = op_alloc(c, rbytes, o->arena & AR_RECV, &o->r_in_arena), recv = o->rbuf,
           send = recv + (size_t)me * nb;
      break;
    case COLL_SCATTER:
      if (!is_root) mode = MODE_OUT;
      else o->sbuf = op_alloc(c, sbytes, 0, &o->s_in_arena), send = o->sbuf, recv = o->sbuf + (size_t)me * nb;
      break;
    case COLL_ALLGATHER:
      o->rbuf = op_alloc(c, rbytes, 0, &o->r_in_arena), recv = o->rbuf, send = recv + (size_t)me * nb;
      break;
    case COLL_REDUCE:
      if (!is_root) mode = MODE_OUT, rbytes = 0; /* recv NULL off the root */
      else o->sbuf = op_alloc(c, sbytes, o->arena, &o->s_in_arena), send = recv = o->sbuf;
      break;
    case COLL_ALLREDUCE:
    case COLL_ALLTOALL:
    case COLL_REDUCE_SCATTER:
      o->sbuf = op_alloc(c, sbytes, o->arena & AR_SEND, &o->s_in_arena), send = recv = o->sbuf;
      break;
    default: mode = MODE_OUT; break;
    }
  } else if (mode == MODE_ALIAS) {
    switch (k) {
    case COLL_GATHER:
      if (!is_root) mode = MODE_OUT;
      else o->rbuf = op_alloc(c, rbytes, o->arena & AR_RECV, &o->r_in_arena), send = recv = o->rbuf;
      break;
    case COLL_SCATTER:
      if (!is_root) mode = MODE_OUT;
      else o->sbuf = op_alloc(c, sbytes, 0, &o->s_in_arena), send = recv = o->sbuf;
      break;
    case COLL_ALLGATHER: o->rbuf = op_alloc(c, rbytes, 0, &o->r_in_arena), send = recv = o->rbuf; break;
    default: mode = MODE_OUT; break;
    }
  }
  if (mode == MODE_OUT) {
    if (sbytes || (n == 0 && k != COLL_BCAST && k != COLL_BARRIER && (o->salt & 1)))
      o->sbuf = op_alloc(c, sbytes, o->arena & AR_SEND, &o->s_in_arena), send = o->sbuf;
    if (rbytes || (n == 0 && k != COLL_BARRIER && (o->salt & 1)))
      o->rbuf = op_alloc(c, rbytes, (o->arena & AR_RECV) || (k == COLL_BCAST && o->arena), &o->r_in_arena),
      recv = o->rbuf;
  }
  /* garbage everywhere, then the inputs */
  if (o->rbuf && o->rbuf != o->sbuf) memset(o->rbuf, 0xEE, rbytes);
  if (o->sbuf && o->sbuf != o->rbuf) memset(o->sbuf, 0xDD, sbytes);
  if (k == COLL_BCAST) {
    if (is_root)
      for (size_t j = 0; j < nb; j++) recv[j] = pat(o->salt, me, 0, j);
  } else if (k == COLL_GATHER || k == COLL_ALLGATHER) {
    for (size_t j = 0; j < nb; j++) send[j] = pat(o->salt, me, 0, j);
  } else if (k == COLL_SCATTER) {
    if (is_root)
      for (int q = 0; q < P; q++)
        for (size_t j = 0; j < nb; j++) send[(size_t)q * nb + j] = pat(o->salt, me, (size_t)q, j);
  } else if (k == COLL_ALLTOALL) {
    for (int q = 0; q < P; q++)
      for (size_t j = 0; j < nb; j++) send[(size_t)q * nb + j] = pat(o->salt, me, (size_t)q, j);
  } else if (kind_reduces(k)) {
    size_t m = sbytes / es;
    for (size_t g = 0; g < m; g++) put(dt, send, g, rval(rc, o->salt, me, g));
  }
  if (mode == MODE_OUT && sbytes) {
    o->send_copy = malloc(sbytes);
    memcpy(o->send_copy, send, sbytes);
    o->send_bytes = sbytes;
  }
  o->a.send = send;
  o->a.recv = recv;
}

static inline int op_verify(coll_comm_t *c, op_t *o) {
  int P = coll_comm_size(c), me = coll_comm_rank(c);
  int is_root = me == o->root;
  coll_kind_t k = o->kind;
  const rcase_t *rc = &rcases[o->rcase];
  coll_dtype_t dt = o->a.dtype;
  size_t es = coll_dtype_size(dt), n = o->count, nb = n * es;
  const uint8_t *recv = o->a.recv;
  char what[256];
  for (int q = 0; q < P; q++) {
    size_t blk_len = 0;
    const uint8_t *blk = NULL;
    int src = 0;
    size_t sblock = 0;
    switch (k) {
    case COLL_BCAST:
      if (q == 0) blk = recv, blk_len = nb, src = o->root, sblock = 0;
      break;
    case COLL_GATHER:
      if (is_root) blk = recv + (size_t)q * nb, blk_len = nb, src = q, sblock = 0;
      break;
    case COLL_ALLGATHER: blk = recv + (size_t)q * nb, blk_len = nb, src = q, sblock = 0; break;
    case COLL_SCATTER:
      if (q == 0) blk = recv, blk_len = nb, src = o->root, sblock = (size_t)me;
      break;
    case COLL_ALLTOALL: blk = recv + (size_t)q * nb, blk_len = nb, src = q, sblock = (size_t)me; break;
    default: break;
    }
    for (size_t j = 0; j < blk_len; j++) {
      uint8_t want = pat(o->salt, src, sblock, j);
      if (blk[j] != want) {
        op_describe(o, me, what, sizeof what);
        fprintf(stderr, "%s: block %d byte %zu: got 0x%02x, want 0x%02x (from rank %d block %zu)\n",
                what, q, j, blk[j], want, src, sblock);
        return 1;
      }
    }
  }
  if ((k == COLL_ALLREDUCE || (k == COLL_REDUCE && is_root) || k == COLL_REDUCE_SCATTER)) {
    size_t base = k == COLL_REDUCE_SCATTER ? (size_t)me * n : 0;
    for (size_t i = 0; i < n; i++) {
      double want = rref(rc, o->salt, P, base + i), got = get(dt, recv, i);
      if (got != want) {
        op_describe(o, me, what, sizeof what);
        fprintf(stderr, "%s: element %zu: got %.17g, want %.17g\n", what, i, got, want);
        return 1;
      }
    }
  }
  if (o->send_copy && memcmp(o->send_copy, o->a.send, o->send_bytes) != 0) {
    op_describe(o, me, what, sizeof what);
    fprintf(stderr, "%s: the send buffer was modified\n", what);
    return 1;
  }
  return 0;
}

static inline void op_release(coll_comm_t *c, op_t *o) {
  if (o->s_in_arena) coll_arena_free(c, o->sbuf);
  else free(o->sbuf);
  if (o->r_in_arena) coll_arena_free(c, o->rbuf);
  else free(o->rbuf);
  free(o->send_copy);
  o->sbuf = o->rbuf = o->send_copy = NULL;
}

static inline int op_set_algo(coll_comm_t *c, const op_t *o) {
  if (o->kind != COLL_ALLREDUCE && o->kind != COLL_REDUCE) return 0;
  int rc = coll_set_algorithm(c, o->kind, o->algo);
  if (rc) fprintf(stderr, "coll_set_algorithm(%s, %s): %s\n", coll_kind_name(o->kind), o->algo, coll_err_name(rc));
  return rc;
}

/* Blocking: run and check one collective. Returns 0, 1 for a wrong result
 * (the communicator is still usable) or 2 if the call failed. */
static inline int op_run(coll_comm_t *c, op_t *o) {
  if (op_set_algo(c, o)) return 1;
  op_prepare(c, o);
  int rc = coll_run(c, &o->a), bad = 0;
  if (rc) {
    char what[256];
    const char *text = "";
    op_describe(o, coll_comm_rank(c), what, sizeof what);
    coll_comm_error(c, &text);
    fprintf(stderr, "%s: coll_run: %s (%s)\n", what, coll_err_name(rc), text);
    bad = 2;
  } else {
    bad = op_verify(c, o);
  }
  op_release(c, o);
  return bad;
}

static inline int req_finish(coll_comm_t *c, coll_req_t *r, op_t *o, const char *what) {
  int rc = coll_req_wait(r, -1);
  coll_req_free(r);
  int bad = 0;
  if (rc) {
    fprintf(stderr, "rank %d: %s: coll_req_wait: %s\n", coll_comm_rank(c), what, coll_err_name(rc));
    bad = 1;
  } else {
    bad = op_verify(c, o);
  }
  op_release(c, o);
  return bad;
}

/* the dtypes the data-movement kinds rotate through */
static const coll_dtype_t move_dtypes[] = {COLL_UINT8, COLL_INT32, COLL_FLOAT64, COLL_FLOAT16, COLL_INT64};

#endif
