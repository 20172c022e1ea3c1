/*
 * test_collectives.c - every collective over real processes.
 *
 * Each case forks P ranks that build a communicator with a job key of their
 * own, run a sequence of collectives and check their own results (inputs are
 * derived from rank, block, element index and a per-call salt, so a stale or
 * misplaced chunk never passes); a rank exits non-zero on the first wrong
 * byte. The parent waits with a timeout and kills stragglers.
 *
 *  matrix     world sizes 1, 2, 3, 4, 5, 8 x every kind x counts {0, 1, 7,
 *             P*13+1, several slot chunks} x every root x out of place / in
 *             place / send == recv, reductions over a rotation of dtype x op,
 *             allreduce and reduce auto / flat / rsag; again with
 *             HBMCOLL_SLOT_BYTES=4096 (many chunks, many parity reuses); again
 *             with HBMCOLL_CMA=1 (large bcast and gather single copy, cma.c)
 *             and with single copy from the smallest non-eager size.
 *  arena      allreduce flat and rsag with buffers in the shared arena on all,
 *             none or some ranks, in place and not; bcast from an arena root;
 *             reduce from an arena root followed by a collective on another
 *             communicator.
 *  requests   several coll_start requests in flight mixed with coll_run,
 *             waited out of order; waiting on a request after coll_comm_free.
 *  split      coll_comm_split with several colors and keys (and color -1),
 *             collectives on parent and children interleaved, nested splits.
 *
 * Prints one line per case and a last line "N passed, N failed"; exits 1 on
 * any failure. Runs under ASan/UBSan (tests/c/Makefile.inc).
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

#define HARNESS_KEY_PREFIX "hbct"
#define MAX_RANKS 128
#include "harness.h"

/* Runs fn in `size` forked ranks with the "NAME=VALUE" strings of env set
 * (spawn_raw) and records a pass if every rank exited with status 0 before
 * timeout_s. Returns 0 if it passed. Its FAIL line lists every rank (up to
 * MAX_RANKS of them) rather than record()'s bounded reason. */
static int spawn(const char *name, int size, double timeout_s, const char *const *env, rank_fn fn,
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

static size_t env_slot_bytes(void) {
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

static int64_t rval(const rcase_t *rc, unsigned salt, int rank, size_t g) {
  uint64_t span = (uint64_t)(rc->hi - rc->lo + 1);
  return rc->lo + (int64_t)(mix((uint64_t)g * 0x9E3779B97F4A7C15ull + ((uint64_t)salt << 44) +
                                ((uint64_t)rank << 28) + 12345) % span);
}

static void put(coll_dtype_t dt, void *b, size_t i, int64_t v) {
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

static double get(coll_dtype_t dt, const void *b, size_t i) {
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
static double rref(const rcase_t *rc, unsigned salt, int P, size_t g) {
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

static int kind_uses_root(coll_kind_t k) {
  return k == COLL_BCAST || k == COLL_GATHER || k == COLL_SCATTER || k == COLL_REDUCE;
}
static int kind_reduces(coll_kind_t k) {
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

static void op_describe(const op_t *o, int rank, char *buf, size_t len) {
  snprintf(buf, len, "rank %d: %s count=%zu dtype=%s%s%s root=%d %s arena=%d algo=%s salt=%u", rank,
           coll_kind_name(o->kind), o->count, coll_dtype_name(o->a.dtype),
           kind_reduces(o->kind) ? " op=" : "", kind_reduces(o->kind) ? coll_op_name(o->a.op) : "",
           o->root, mode_names[o->mode], o->arena, o->algo ? o->algo : "auto", o->salt);
}

static uint8_t *op_alloc(coll_comm_t *c, size_t bytes, int arena, int *in_arena) {
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

static void op_prepare(coll_comm_t *c, op_t *o) {
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

static int op_verify(coll_comm_t *c, op_t *o) {
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

static void op_release(coll_comm_t *c, op_t *o) {
  if (o->s_in_arena) coll_arena_free(c, o->sbuf);
  else free(o->sbuf);
  if (o->r_in_arena) coll_arena_free(c, o->rbuf);
  else free(o->rbuf);
  free(o->send_copy);
  o->sbuf = o->rbuf = o->send_copy = NULL;
}

static int op_set_algo(coll_comm_t *c, const op_t *o) {
  if (o->kind != COLL_ALLREDUCE && o->kind != COLL_REDUCE) return 0;
  int rc = coll_set_algorithm(c, o->kind, o->algo);
  if (rc) fprintf(stderr, "coll_set_algorithm(%s, %s): %s\n", coll_kind_name(o->kind), o->algo, coll_err_name(rc));
  return rc;
}

/* Blocking: run and check one collective. Returns 0, 1 for a wrong result
 * (the communicator is still usable) or 2 if the call failed. */
static int op_run(coll_comm_t *c, op_t *o) {
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

/* ---- the matrix --------------------------------------------------------------- */

static const coll_dtype_t move_dtypes[] = {COLL_UINT8, COLL_INT32, COLL_FLOAT64, COLL_FLOAT16, COLL_INT64};

/* arg: NULL, or the single-copy verdict the communicator must reach */
static int rank_matrix(int rank, int size, const char *key, void *arg) {
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  if (arg && size > 1 && coll_comm_single_copy(c) != *(const int *)arg) {
    fprintf(stderr, "rank %d: single copy %d, expected %d\n", rank, coll_comm_single_copy(c),
            *(const int *)arg);
    return 1;
  }
  size_t slot = env_slot_bytes();
  size_t counts_bytes_big = 3 * slot + 1000; /* 4 chunks of a slot; many more of a piece */
  unsigned salt = 0;
  int bad = 0;
  for (int k = 0; k < COLL_KIND_COUNT && bad < 2; k++) {
    coll_kind_t kind = (coll_kind_t)k;
    int nroots = kind_uses_root(kind) ? size : 1;
    int nmodes = (kind == COLL_GATHER || kind == COLL_SCATTER || kind == COLL_ALLGATHER) ? 3
                 : kind == COLL_BCAST || kind == COLL_BARRIER                           ? 1
                                                                                        : 2;
    for (int ci = 0; ci < 5 && bad < 2; ci++) {
      for (int root = 0; root < nroots && bad < 2; root++) {
        for (int mode = 0; mode < nmodes && bad < 2; mode++) {
          int ncases = kind_reduces(kind) && ci == 2 ? NRCASES : 1;
          for (int rci = 0; rci < ncases && bad < 2; rci++) {
            static const char *const algos[] = {NULL, "flat", "rsag"};
            int nalgos = kind == COLL_ALLREDUCE ? 3 : kind == COLL_REDUCE ? 2 : 1;
            for (int ai = 0; ai < nalgos && bad < 2; ai++) {
              op_t o;
              memset(&o, 0, sizeof o);
              o.kind = kind;
              o.root = root;
              o.mode = mode;
              o.salt = ++salt;
              o.rcase = ncases > 1 ? rci : (ci + root + mode + ai) % NRCASES;
              o.dtype = move_dtypes[(size_t)(ci + root + mode) % (sizeof move_dtypes / sizeof move_dtypes[0])];
              o.algo = kind == COLL_REDUCE ? algos[ai + 1] : algos[ai];
              size_t es = coll_dtype_size(kind_reduces(kind) ? rcases[o.rcase].dtype : o.dtype);
              size_t counts[5] = {0, 1, 7, (size_t)size * 13 + 1, counts_bytes_big / es + 1};
              o.count = counts[ci];
              int r = op_run(c, &o);
              if (r > bad) bad = r;
            }
          }
        }
      }
    }
  }
  if (getenv("TEST_VERBOSE") && rank == 0)
    fprintf(stderr, "matrix P=%d slot=%zu: %u collectives\n", size, slot, salt);
  coll_set_algorithm(c, COLL_ALLREDUCE, NULL);
  coll_set_algorithm(c, COLL_REDUCE, NULL);
  /* and a barrier last: nobody frees while a peer still reads */
  coll_args_t b = {.kind = COLL_BARRIER};
  if (bad < 2 && coll_run(c, &b) != 0) bad = 2;
  coll_comm_free(c);
  return bad;
}

/* ---- arena buffers ---------------------------------------------------------- */

/* who: 0 none, 1 all, 2 even ranks, 3 rank 0 only */
static int arena_pick(int who, int rank) {
  return who == 1 || (who == 2 && rank % 2 == 0) || (who == 3 && rank == 0);
}

static int rank_arena(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  size_t slot = env_slot_bytes();
  unsigned salt = 1000;
  int bad = 0;
  /* allreduce: flat / rsag x in place or not x arena on all / none / some ranks,
   * and arena on send only / recv only / both */
  static const char *const algos[] = {"flat", "rsag"};
  for (int ai = 0; ai < 2 && !bad; ai++)
    for (int ci = 0; ci < 5 && !bad; ci++)
      for (int mode = 0; mode < 2 && !bad; mode++)
        for (int who = 0; who < 4 && !bad; who++)
          for (int where = 1; where <= 3 && !bad; where++) {
            if (mode == MODE_IN && where != 3) continue;
            op_t o;
            memset(&o, 0, sizeof o);
            o.kind = COLL_ALLREDUCE;
            o.mode = mode;
            o.algo = algos[ai];
            o.salt = ++salt;
            o.rcase = (ci + who + where) % NRCASES;
            size_t es = coll_dtype_size(rcases[o.rcase].dtype);
            size_t counts[5] = {0, 1, 7, (size_t)size * 13 + 1, (3 * slot + 1000) / es + 1};
            o.count = counts[ci];
            o.arena = arena_pick(who, rank) ? where : 0;
            bad = op_run(c, &o);
          }
  coll_set_algorithm(c, COLL_ALLREDUCE, NULL);
  /* reduce with arena inputs on some ranks (flat reads them in place) */
  for (int root = 0; root < size && !bad; root++)
    for (int who = 0; who < 4 && !bad; who++)
      for (int ci = 0; ci < 3 && !bad; ci++) {
        op_t o;
        memset(&o, 0, sizeof o);
        o.kind = COLL_REDUCE;
        o.mode = MODE_OUT;
        o.algo = "flat";
        o.root = root;
        o.salt = ++salt;
        o.rcase = (root + who) % NRCASES;
        size_t counts[3] = {1, 7, (size_t)size * 13 + 1};
        o.count = counts[ci];
        o.arena = arena_pick(who, rank) ? AR_SEND : 0;
        bad = op_run(c, &o);
      }
  coll_set_algorithm(c, COLL_REDUCE, NULL);
  /* gather into an arena output on the root (others push the chunks after the
   * first straight into it), in place or not, send in the arena or not */
  for (int root = 0; root < size && !bad; root++)
    for (int mode = 0; mode < 3 && !bad; mode++)
      for (int ci = 0; ci < 3 && !bad; ci++) {
        op_t o;
        memset(&o, 0, sizeof o);
        o.kind = COLL_GATHER;
        o.mode = mode;
        o.root = root;
        o.dtype = move_dtypes[(root + ci) % 5];
        o.salt = ++salt;
        size_t counts[3] = {7, (size_t)size * 13 + 1, (3 * slot + 1000) / coll_dtype_size(o.dtype) + 1};
        o.count = counts[ci];
        o.arena = rank == root ? AR_RECV | (ci % 2 ? AR_SEND : 0) : (ci + rank) % 2 ? AR_SEND : 0;
        bad = op_run(c, &o);
      }
  /* bcast from an arena root (and arena receivers), every root, several counts */
  for (int root = 0; root < size && !bad; root++)
    for (int ci = 0; ci < 4 && !bad; ci++) {
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = COLL_BCAST;
      o.root = root;
      o.dtype = COLL_UINT8;
      o.salt = ++salt;
      size_t counts[4] = {0, 7, (size_t)size * 13 + 1, 3 * slot + 1000};
      o.count = counts[ci];
      o.arena = rank == root || ci % 2 ? AR_RECV : 0;
      bad = op_run(c, &o);
    }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

/* A reduce whose root reads its own input from the arena, then a collective on
 * another communicator. Nobody but the root reads the root's input, so the
 * root must not wait for the others after the reduce: they are already in the
 * next collective (on `sub`), which needs the root. */
static int rank_arena_reduce_then_other(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c, *sub = NULL;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0, rc;
  if ((rc = coll_comm_split(c, 0, 0, &sub)) != 0) {
    fprintf(stderr, "rank %d: split: %s\n", rank, coll_err_name(rc));
    coll_comm_free(c);
    return 1;
  }
  for (int root = 0; root < size && !bad; root++) {
    op_t o;
    memset(&o, 0, sizeof o);
    o.kind = COLL_REDUCE;
    o.mode = MODE_OUT;
    o.root = root;
    o.algo = "flat";
    o.salt = 77 + (unsigned)root;
    o.rcase = 0;
    o.count = 7;
    o.arena = rank == root ? AR_SEND : 0;
    bad = op_run(c, &o);
    coll_args_t b = {.kind = COLL_BARRIER};
    if (!bad && (rc = coll_run(sub, &b)) != 0) {
      fprintf(stderr, "rank %d: barrier on the sub-communicator after reduce(root %d): %s\n", rank, root,
              coll_err_name(rc));
      bad = 1;
    }
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(sub);
  coll_comm_free(c);
  return bad;
}

/* ---- nonblocking requests ------------------------------------------------------ */

static int req_finish(coll_comm_t *c, coll_req_t *r, op_t *o, const char *what) {
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

/* ---- split ------------------------------------------------------------------------ */

static int check_members(coll_comm_t *sub, const int32_t *expect_old, int n, const char *what) {
  /* allgather the old ranks: must come out in the expected order */
  int32_t mine[2] = {expect_old[coll_comm_rank(sub)], 0};
  int32_t *all = calloc((size_t)n * 2, sizeof *all);
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 2, .send = mine, .recv = all};
  int rc = coll_run(sub, &a), bad = 0;
  if (rc) fprintf(stderr, "%s: allgather: %s\n", what, coll_err_name(rc)), bad = 1;
  for (int i = 0; i < n && !bad; i++)
    if (all[2 * i] != expect_old[i]) fprintf(stderr, "%s: member %d is old rank %d, want %d\n", what, i, all[2 * i], expect_old[i]), bad = 1;
  free(all);
  return bad;
}

static int rank_split(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0, rc;
  unsigned salt = 9000;
  for (int round = 0; round < 3 && !bad; round++) {
    /* A: color rank % 2, key -rank: members in decreasing old rank */
    /* B: color rank % 3, but rank % 3 == 2 joins none; key = 0: by old rank */
    coll_comm_t *a = NULL, *b = NULL, *nested = NULL;
    int ca = rank % 2, cb = rank % 3 == 2 ? -1 : rank % 3;
    /* a request on the parent stays in flight across the splits */
    op_t pending;
    memset(&pending, 0, sizeof pending);
    pending.kind = COLL_ALLREDUCE;
    pending.salt = ++salt;
    pending.count = 5000 + (size_t)round;
    pending.rcase = round;
    op_prepare(c, &pending);
    coll_req_t *req;
    if ((rc = coll_start(c, &pending.a, &req)) != 0) return 1;
    if ((rc = coll_comm_split(c, ca, -rank, &a)) != 0) {
      fprintf(stderr, "rank %d: split A: %s\n", rank, coll_err_name(rc));
      return 1;
    }
    if ((rc = coll_comm_split(c, cb, 0, &b)) != 0) {
      fprintf(stderr, "rank %d: split B: %s\n", rank, coll_err_name(rc));
      return 1;
    }
    if ((cb < 0) != (b == NULL)) fprintf(stderr, "rank %d: color -1 must give NULL\n", rank), bad = 1;
    int32_t expa[MAX_RANKS], expb[MAX_RANKS];
    int na = 0, nb = 0;
    for (int r = size - 1; r >= 0; r--)
      if (r % 2 == ca) expa[na++] = r;
    for (int r = 0; r < size; r++)
      if (cb >= 0 && r % 3 == cb) expb[nb++] = r;
    if (coll_comm_size(a) != na || expa[coll_comm_rank(a)] != rank)
      fprintf(stderr, "rank %d: split A gave rank %d of %d\n", rank, coll_comm_rank(a), coll_comm_size(a)), bad = 1;
    if (b && (coll_comm_size(b) != nb || expb[coll_comm_rank(b)] != rank))
      fprintf(stderr, "rank %d: split B gave rank %d of %d\n", rank, coll_comm_rank(b), coll_comm_size(b)), bad = 1;
    if (bad) return 1;
    /* interleave: parent, A, B, parent, A ... */
    bad |= check_members(a, expa, na, "split A");
    if (b) bad |= check_members(b, expb, nb, "split B");
    for (int i = 0; i < 4 && !bad; i++) {
      op_t o;
      memset(&o, 0, sizeof o);
      static const coll_kind_t ks[4] = {COLL_ALLREDUCE, COLL_BCAST, COLL_ALLTOALL, COLL_REDUCE};
      o.kind = ks[i];
      o.count = 3 + (size_t)i * 50;
      o.dtype = COLL_INT32;
      o.rcase = i;
      o.salt = ++salt;
      o.root = 0;
      bad |= op_run(a, &o);
      o.salt = ++salt; /* the same on every rank, in b or not */
      if (b) bad |= op_run(b, &o);
      o.salt = ++salt;
      o.root = i % size;
      bad |= op_run(c, &o);
    }
    bad |= req_finish(c, req, &pending, "allreduce in flight across splits");
    /* nested: split A by (old rank / 2) % 2 */
    if (!bad) {
      int cn = (rank / 2) % 2;
      if ((rc = coll_comm_split(a, cn, rank, &nested)) != 0) {
        fprintf(stderr, "rank %d: nested split: %s\n", rank, coll_err_name(rc));
        return 1;
      }
      int32_t expn[MAX_RANKS];
      int nn = 0;
      for (int r = 0; r < size; r++)
        if (r % 2 == ca && (r / 2) % 2 == cn) expn[nn++] = r;
      bad |= check_members(nested, expn, nn, "nested split");
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = COLL_ALLREDUCE;
      o.count = 33;
      o.salt = ++salt;
      bad |= op_run(nested, &o);
    }
    coll_args_t bar = {.kind = COLL_BARRIER};
    if (!bad && nested && coll_run(nested, &bar) != 0) bad = 1;
    if (!bad && b && coll_run(b, &bar) != 0) bad = 1;
    if (!bad && coll_run(a, &bar) != 0) bad = 1;
    coll_comm_free(nested);
    coll_comm_free(b);
    coll_comm_free(a);
  }
  coll_args_t bar = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &bar) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

/* ---- a random sequence ------------------------------------------------------------- */

/* The same pseudo-random sequence of collectives on every rank (kind, count,
 * root, mode, algorithm, arena, blocking or not), with rank-private random
 * pauses: every transition between kinds, readers and slot parities, with
 * ranks running ahead and falling behind. */
static uint64_t seq_next(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  return mix(*s);
}

static int rank_random(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  size_t slot = env_slot_bytes();
  const char *seed = getenv("TEST_SEED"); /* reproduce a run: TEST_SEED=n */
  uint64_t shared = 42 + (seed ? strtoull(seed, NULL, 10) : 0), mine = 1000 + (uint64_t)rank + shared * 131;
  int bad = 0;
  enum { NPEND = 3 };
  op_t pend[NPEND];
  coll_req_t *reqs[NPEND];
  int npend = 0;
  for (unsigned i = 0; i < 400 && bad < 2; i++) {
    op_t o;
    memset(&o, 0, sizeof o);
    o.kind = (coll_kind_t)(seq_next(&shared) % COLL_KIND_COUNT);
    o.root = (int)(seq_next(&shared) % (uint64_t)size);
    o.mode = (int)(seq_next(&shared) % 3);
    o.rcase = (int)(seq_next(&shared) % NRCASES);
    o.dtype = move_dtypes[seq_next(&shared) % 5];
    o.salt = 20000 + i;
    uint64_t pick = seq_next(&shared) % 8;
    size_t es = coll_dtype_size(kind_reduces(o.kind) ? rcases[o.rcase].dtype : o.dtype);
    o.count = pick < 2 ? (size_t)pick : pick < 6 ? (size_t)(seq_next(&shared) % 300) : (size_t)(seq_next(&shared) % (3 * slot / es));
    static const char *const algos[] = {NULL, "flat", "rsag"};
    o.algo = algos[seq_next(&shared) % 3];
    if (o.kind == COLL_REDUCE && o.algo == NULL) o.algo = "flat";
    o.arena = (o.kind == COLL_ALLREDUCE || o.kind == COLL_BCAST || o.kind == COLL_REDUCE) ? (int)(seq_next(&mine) % 4) : 0;
    int nonblocking = seq_next(&shared) % 3 == 0;
    if (seq_next(&mine) % 6 == 0) usleep((useconds_t)(seq_next(&mine) % 3000));
    if (nonblocking && o.kind != COLL_ALLREDUCE && o.kind != COLL_REDUCE) { /* algorithms are set per call */
      if (npend == NPEND) { /* retire the oldest */
        int r = req_finish(c, reqs[0], &pend[0], "random sequence");
        if (r > bad) bad = r;
        memmove(pend, pend + 1, sizeof pend[0] * (NPEND - 1));
        memmove(reqs, reqs + 1, sizeof reqs[0] * (NPEND - 1));
        npend--;
      }
      pend[npend] = o;
      op_prepare(c, &pend[npend]);
      int rc = coll_start(c, &pend[npend].a, &reqs[npend]);
      if (rc) {
        fprintf(stderr, "rank %d: coll_start: %s\n", rank, coll_err_name(rc));
        return 1;
      }
      npend++;
      continue;
    }
    if (npend && (o.kind == COLL_ALLREDUCE || o.kind == COLL_REDUCE)) { /* drain before changing the algorithm */
      for (int k = 0; k < npend; k++) {
        int r = req_finish(c, reqs[k], &pend[k], "random sequence");
        if (r > bad) bad = r;
      }
      npend = 0;
    }
    int r = op_run(c, &o);
    if (r > bad) bad = r;
  }
  for (int k = 0; k < npend; k++) {
    int r = req_finish(c, reqs[k], &pend[k], "random sequence");
    if (r > bad) bad = r;
  }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (bad < 2 && coll_run(c, &b) != 0) bad = 2;
  coll_comm_free(c);
  return bad;
}

/* ---- many ranks, small slots -------------------------------------------------------- */

/* alltoall, scatter and reduce_scatter split a slot into P pieces of whole
 * cache lines: with HBMCOLL_SLOT_BYTES=4096 and more than 64 ranks a piece
 * would be 0 bytes. */
static int rank_many(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 0, &c)) return 1;
  int bad = 0;
  unsigned salt = 300;
  static const coll_kind_t kinds[] = {COLL_ALLTOALL, COLL_SCATTER, COLL_REDUCE_SCATTER, COLL_ALLGATHER,
                                      COLL_ALLREDUCE};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0] && !bad; i++)
    for (int ci = 0; ci < 2 && !bad; ci++) {
      op_t o;
      memset(&o, 0, sizeof o);
      o.kind = kinds[i];
      o.root = size - 1;
      o.dtype = COLL_INT32;
      o.rcase = 0;
      o.count = ci == 0 ? 3 : 40; /* 40 x 4 B x 65: more than a 4 KiB slot */
      o.salt = ++salt;
      bad = op_run(c, &o);
    }
  coll_args_t b = {.kind = COLL_BARRIER};
  if (!bad && coll_run(c, &b) != 0) bad = 1;
  coll_comm_free(c);
  return bad;
}

/* ---- main --------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  static const int sizes[] = {1, 2, 3, 4, 5, 8};
  const char *only = argc > 1 ? argv[1] : NULL; /* run the cases whose name contains this */
  const char *const small_slots[] = {"HBMCOLL_SLOT_BYTES=4096", NULL};
  const char *const timeout10[] = {"HBMCOLL_TIMEOUT=10", NULL};
  const char *const push_always[] = {"HBMCOLL_STREAM_MIN=0", NULL};
  const char *const rep_movsb_always[] = {"HBMCOLL_REP_MOVSB_MIN=0", NULL};
  const char *const single_copy[] = {"HBMCOLL_CMA=1", NULL};
  const char *const all_single_copy[] = {"HBMCOLL_CMA=1", "HBMCOLL_SLOT_BYTES=4096", "HBMCOLL_CMA_MIN=1", NULL};
  static const int yes = 1, no = 0;
  char name[96];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int P = sizes[i];
    if (CASE("matrix slot=4096")) spawn("matrix slot=4096", P, 600, small_slots, rank_matrix, NULL);
    if (CASE("matrix staged only")) spawn("matrix staged only", P, 600, NULL, rank_matrix, (void *)&no);
    if ((P == 2 || P == 5) && CASE("matrix single copy (HBMCOLL_CMA=1)"))
      spawn("matrix single copy (HBMCOLL_CMA=1)", P, 600, single_copy, rank_matrix, (void *)&yes);
    if ((P == 2 || P == 3 || P == 8) && CASE("matrix single copy from 1 B, slot=4096"))
      spawn("matrix single copy from 1 B, slot=4096", P, 600, all_single_copy, rank_matrix, (void *)&yes);
    if ((P == 2 || P == 3) && CASE("matrix streaming stores from 0 B"))
      spawn("matrix streaming stores from 0 B", P, 600, push_always, rank_matrix, NULL);
    if ((P == 2 || P == 3) && CASE("matrix rep movsb from 0 B"))
      spawn("matrix rep movsb from 0 B", P, 600, rep_movsb_always, rank_matrix, NULL);
    if (CASE("arena")) spawn("arena", P, 600, NULL, rank_arena, NULL);
    if (CASE("arena rep movsb from 0 B")) spawn("arena rep movsb from 0 B", P, 600, rep_movsb_always, rank_arena, NULL);
    if (CASE("arena slot=4096")) spawn("arena slot=4096", P, 600, small_slots, rank_arena, NULL);
    if (CASE("arena streaming stores from 0 B"))
      spawn("arena streaming stores from 0 B", P, 600, push_always, rank_arena, NULL);
    if (P > 1 && CASE("arena reduce then other comm"))
      spawn("arena reduce then other comm", P, 60, timeout10, rank_arena_reduce_then_other, NULL);
    if (CASE("requests")) spawn("requests", P, 300, NULL, rank_requests, NULL);
    if (CASE("requests slot=4096")) spawn("requests slot=4096", P, 300, small_slots, rank_requests, NULL);
    if (CASE("free with request pending")) spawn("free with request pending", P, 60, NULL, rank_free_pending, NULL);
    if (CASE("random sequence")) spawn("random sequence", P, 300, NULL, rank_random, NULL);
    if (CASE("random sequence slot=4096")) spawn("random sequence slot=4096", P, 300, small_slots, rank_random, NULL);
    snprintf(name, sizeof name, "split");
    if (CASE(name)) spawn(name, P, 300, NULL, rank_split, NULL);
  }
  if (CASE("many ranks, slot=4096")) spawn("many ranks, slot=4096", 65, 600, small_slots, rank_many, NULL);
  return harness_finish();
}
