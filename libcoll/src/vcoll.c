/*
 * vcoll.c - the collectives with a count per rank (coll_run_v), on any communicator: one node's
 * or one that spans nodes, since both steps are coll_run calls.
 *
 * The agreement. Every rank allgathers a row of int64 words: its call (kind, dtype, op, root),
 * a hash of its counts, the sizes of its buffers and, for alltoall, its whole row of counts.
 * Every rank then reads every row the same way and reaches the same verdict, so a rank with wrong
 * arguments makes every rank return COLL_EMISMATCH with the same sentence, and the communicator
 * goes on (as a disagreement across nodes does: the next call starts from the same place).
 *
 * The move. Each block is padded to the widest one and the fixed-size collective of the kind
 * moves them: size x the widest block instead of the sum of the blocks, the same for blocks of
 * similar sizes and up to size times more when one block dwarfs the others. When every block has
 * the same size, the call is the fixed-size collective on the caller's buffers.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "nodes.h"

enum { V_MADE = -1, V_NONE = -2 }; /* a row's V_RECV without a buffer: made by alloc, or none */
enum { V_BAD, V_KIND, V_DTYPE, V_OP, V_ROOT, V_GIVEN, V_HASH, V_SEND, V_RECV, V_HEAD };

typedef struct {
  coll_comm_t *c;
  const coll_vargs_t *a;
  int rank, size;
  size_t es;
  int64_t *rows;   /* [size][width]: every rank's row */
  size_t width;    /* words per row */
  size_t *counts;  /* [size]: the blocks (alltoall: what each rank sends to this one) */
  size_t widest;   /* the largest block of the call (alltoall: of every row) */
  int uniform;     /* every block has the widest size */
  char text[COLL_TEXT_MAX];
} vcall_t;

static const char *v_name(coll_kind_t k) {
  switch (k) {
  case COLL_GATHER: return "gatherv";
  case COLL_SCATTER: return "scatterv";
  case COLL_ALLGATHER: return "allgatherv";
  case COLL_REDUCE_SCATTER: return "reduce_scatterv";
  case COLL_ALLTOALL: return "alltoallv";
  default: return "a v-collective";
  }
}

static int v_refuse(vcall_t *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int v_refuse(vcall_t *v, const char *fmt, ...) {
  int n = snprintf(v->text, sizeof v->text, "%s: ", v_name(v->a->kind));
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(v->text + n, sizeof v->text - (size_t)n, fmt, ap);
  va_end(ap);
  return COLL_EMISMATCH;
}

static uint64_t v_hash(const size_t *counts, int n) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a over the counts' bytes */
  for (int i = 0; i < n; i++)
    for (int b = 0; b < 8; b++) h = (h ^ ((uint64_t)counts[i] >> (8 * b) & 0xff)) * 1099511628211ull;
  return h;
}

static size_t v_sum(const size_t *x, int n) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += x[i];
  return s;
}

/* What this rank may say of its own arguments alone (1: something is missing). */
static int v_own_bad(const vcall_t *v) {
  const coll_vargs_t *a = v->a;
  int gathers = a->kind == COLL_GATHER || a->kind == COLL_ALLGATHER;
  if (a->counts == NULL && !gathers) return 1;
  if ((unsigned)a->dtype >= COLL_DTYPE_COUNT || ((unsigned)a->op >= COLL_OP_COUNT && a->kind == COLL_REDUCE_SCATTER))
    return 1;
  if ((a->kind == COLL_GATHER || a->kind == COLL_SCATTER) && (a->root < 0 || a->root >= v->size)) return 1;
  int sends = a->kind != COLL_SCATTER || a->root == v->rank;
  return sends && a->send_count && a->send == NULL;
}

static void v_row(const vcall_t *v, int64_t *row) {
  const coll_vargs_t *a = v->a;
  row[V_BAD] = v_own_bad(v);
  row[V_KIND] = a->kind, row[V_DTYPE] = a->dtype;
  row[V_OP] = a->kind == COLL_REDUCE_SCATTER ? a->op : 0;
  row[V_ROOT] = a->kind == COLL_GATHER || a->kind == COLL_SCATTER ? a->root : 0;
  row[V_GIVEN] = a->counts != NULL;
  row[V_HASH] = a->counts && a->kind != COLL_ALLTOALL ? (int64_t)v_hash(a->counts, v->size) : 0;
  row[V_SEND] = (int64_t)a->send_count;
  row[V_RECV] = a->recv ? (int64_t)a->recv_count : a->alloc ? V_MADE : V_NONE;
  for (int j = 0; a->kind == COLL_ALLTOALL && j < v->size; j++) row[V_HEAD + j] = a->counts ? (int64_t)a->counts[j] : 0;
}

/* The others are waiting for this rank's part: it fails the communicator for every rank. */
static int v_no_memory(vcall_t *v) {
  char text[160];
  snprintf(text, sizeof text, "rank %d: no memory for %s's blocks; the communicator is closed", v->rank,
           v_name(v->a->kind));
  if (v->c->span) { /* the other nodes hear of it too (their waits end), not this node's ranks alone */
    coll__span_fail(v->c, -ENOMEM, text);
    return -ENOMEM;
  }
  return coll__fail(v->c, -ENOMEM, "%s", text);
}

/* The sizes every rank must hold, and the blocks (v->counts), from every row: 0 or a refusal. */
static int v_verdict(vcall_t *v) {
  const coll_vargs_t *a = v->a;
  int P = v->size;
  const int64_t *r0 = v->rows;
  for (int i = 0; i < P; i++) {
    const int64_t *r = v->rows + (size_t)i * v->width;
    if (r[V_BAD]) return v_refuse(v, "rank %d gave wrong arguments (no counts, no buffer, or a root, dtype or op "
                                     "out of range)", i);
    if (r[V_KIND] != r0[V_KIND]) return v_refuse(v, "rank %d called a different collective", i);
    if (r[V_DTYPE] != r0[V_DTYPE])
      return v_refuse(v, "rank 0 gave %s, rank %d gave %s", coll_dtype_name((coll_dtype_t)r0[V_DTYPE]), i,
                      coll_dtype_name((coll_dtype_t)r[V_DTYPE]));
    if (r[V_OP] != r0[V_OP] || r[V_ROOT] != r0[V_ROOT]) return v_refuse(v, "ranks 0 and %d gave different ops or roots", i);
    if (r[V_GIVEN] != r0[V_GIVEN] || r[V_HASH] != r0[V_HASH])
      return v_refuse(v, "ranks 0 and %d gave different counts (every rank gives the same, or none does)", i);
  }
  /* no size a buffer could not hold: then no sum or padded row below overflows */
  size_t limit = SIZE_MAX / 2 / v->es / (size_t)P;
  for (int i = 0; i < P; i++) {
    const int64_t *r = v->rows + (size_t)i * v->width;
    if (r[V_SEND] < 0 || (size_t)r[V_SEND] > limit * (size_t)P || r[V_RECV] < V_NONE)
      return v_refuse(v, "rank %d gave a buffer size no buffer can have", i);
    for (int j = 0; a->kind == COLL_ALLTOALL && j < P; j++)
      if (r[V_HEAD + j] < 0 || (size_t)r[V_HEAD + j] > limit)
        return v_refuse(v, "rank %d's count for rank %d is more than a buffer can hold", i, j);
  }
  size_t *n = v->counts;
  for (int i = 0; i < P; i++) {
    const int64_t *r = v->rows + (size_t)i * v->width;
    n[i] = a->kind == COLL_ALLTOALL ? (size_t)r[V_HEAD + v->rank] : a->counts ? a->counts[i] : (size_t)r[V_SEND];
    if (n[i] > limit) return v_refuse(v, "rank %d's block of %zu elements is more than a buffer can hold", i, n[i]);
  }
  size_t total = v_sum(n, P);
  v->widest = 0;
  for (int i = 0; i < P; i++) {
    const int64_t *r = v->rows + (size_t)i * v->width;
    size_t own = a->kind == COLL_ALLTOALL ? 0 : a->counts ? a->counts[i] : (size_t)r[V_SEND], sent = (size_t)r[V_SEND];
    size_t row_sum = 0, gets = 0, want_send, want_recv;
    for (int j = 0; a->kind == COLL_ALLTOALL && j < P; j++) {
      size_t x = (size_t)r[V_HEAD + j];
      row_sum += x, v->widest = x > v->widest ? x : v->widest;
      gets += (size_t)v->rows[(size_t)j * v->width + V_HEAD + i];
    }
    switch (a->kind) {
    case COLL_GATHER: want_send = own, want_recv = i == a->root ? total : (size_t)-1; break;
    case COLL_ALLGATHER: want_send = own, want_recv = total; break;
    case COLL_SCATTER: want_send = i == a->root ? total : (size_t)-1, want_recv = own; break;
    case COLL_REDUCE_SCATTER: want_send = total, want_recv = own; break;
    default: want_send = row_sum, want_recv = gets; break;
    }
    if (want_send != (size_t)-1 && sent != want_send)
      return v_refuse(v, "rank %d sends %zu elements; the counts say %zu", i, sent, want_send);
    if (want_recv != (size_t)-1 && want_recv && r[V_RECV] == V_NONE)
      return v_refuse(v, "rank %d gave no receive buffer (and no alloc) for its %zu elements", i, want_recv);
    if (want_recv != (size_t)-1 && r[V_RECV] >= 0 && (size_t)r[V_RECV] != want_recv)
      return v_refuse(v, "rank %d's receive buffer holds %lld elements; its result has %zu", i, (long long)r[V_RECV],
                      want_recv);
    if (a->kind != COLL_ALLTOALL) v->widest = n[i] > v->widest ? n[i] : v->widest;
  }
  v->uniform = 1;
  for (int i = 0; i < P; i++) {
    const int64_t *r = v->rows + (size_t)i * v->width;
    v->uniform &= n[i] == v->widest;
    for (int j = 0; a->kind == COLL_ALLTOALL && j < P; j++) v->uniform &= (size_t)r[V_HEAD + j] == v->widest;
  }
  return 0;
}

/* The result's bytes on this rank (0: it gets none). */
static size_t v_result_elems(const vcall_t *v) {
  const coll_vargs_t *a = v->a;
  switch (a->kind) {
  case COLL_GATHER: return v->rank == a->root ? v_sum(v->counts, v->size) : 0;
  case COLL_ALLGATHER:
  case COLL_ALLTOALL: return v_sum(v->counts, v->size);
  default: return v->counts[v->rank];
  }
}

/* The caller's receive buffer, or one made by its alloc now that the size is known. */
static void *v_recv(const vcall_t *v) {
  const coll_vargs_t *a = v->a;
  size_t n = v_result_elems(v);
  if (a->recv || n == 0 || a->alloc == NULL) return a->recv;
  return a->alloc(a->alloc_arg, n * v->es);
}

/* Blocks of n[i] elements end to end in src, each into the front of a row of `width` elements. */
static void v_spread(uint8_t *rows, const uint8_t *src, const size_t *n, int P, size_t width, size_t es) {
  for (int i = 0; i < P; i++) {
    uint8_t *to = rows + (size_t)i * width * es;
    memcpy(to, src, n[i] * es);
    memset(to + n[i] * es, 0, (width - n[i]) * es); /* the same bytes on every run */
    src += n[i] * es;
  }
}

/* The fronts of rows of `width` elements, n[i] of row i, end to end into dst. */
static void v_join(uint8_t *dst, const uint8_t *rows, const size_t *n, int P, size_t width, size_t es) {
  for (int i = 0; i < P; i++) {
    memcpy(dst, rows + (size_t)i * width * es, n[i] * es);
    dst += n[i] * es;
  }
}

static int v_move(vcall_t *v) {
  const coll_vargs_t *a = v->a;
  int P = v->size, me = v->rank, receives = v_result_elems(v) > 0;
  size_t w = v->widest, es = v->es, row = w * es;
  coll_args_t f = {.kind = a->kind, .dtype = a->dtype, .op = a->op, .root = a->root, .count = w};
  uint8_t *recv = receives ? v_recv(v) : NULL; /* NULL: alloc failed; this rank takes part, says so after */
  if (v->uniform && (recv || !receives)) { /* the fixed-size collective on the caller's buffers */
    f.send = a->send, f.recv = recv;
    if (a->kind == COLL_SCATTER && me != a->root) f.send = NULL;
    return coll_run(v->c, &f);
  }
  int sends = a->kind != COLL_SCATTER || me == a->root;
  size_t in_rows = !sends ? 0 : a->kind == COLL_GATHER || a->kind == COLL_ALLGATHER ? 1 : (size_t)P;
  size_t out_rows = a->kind == COLL_SCATTER || a->kind == COLL_REDUCE_SCATTER ? 1
                    : a->kind == COLL_GATHER && me != a->root ? 0 : (size_t)P;
  uint8_t *in = malloc(in_rows * row + 1), *out = malloc(out_rows * row + 1);
  int rc = in && out ? 0 : v_no_memory(v);
  if (rc == 0 && sends) {
    if (in_rows == 1) {
      memcpy(in, a->send, a->send_count * es);
      memset(in + a->send_count * es, 0, row - a->send_count * es);
    } else { /* alltoall: my own row of counts; scatter and reduce_scatter: the blocks */
      v_spread(in, a->send, a->kind == COLL_ALLTOALL ? a->counts : v->counts, P, w, es);
    }
  }
  if (rc == 0) {
    f.send = sends ? in : NULL, f.recv = out;
    rc = coll_run(v->c, &f);
  }
  if (rc == 0 && recv) {
    if (out_rows == 1) memcpy(recv, out, v->counts[me] * es);
    else if (a->kind != COLL_GATHER || me == a->root) v_join(recv, out, v->counts, P, w, es);
  } else if (rc == 0 && receives) {
    rc = COLL_EBADARG; /* alloc gave nothing: the call went on for the others' sake */
  }
  free(in);
  free(out);
  return rc;
}

int coll_run_v(coll_comm_t *c, const coll_vargs_t *a) {
  if (c == NULL || a == NULL) return COLL_EBADARG;
  if (a->kind != COLL_GATHER && a->kind != COLL_SCATTER && a->kind != COLL_ALLGATHER &&
      a->kind != COLL_REDUCE_SCATTER && a->kind != COLL_ALLTOALL)
    return COLL_EBADARG; /* the same on every rank, or the next call finds the difference */
  vcall_t v = {.c = c, .a = a, .rank = coll_comm_rank(c), .size = coll_comm_size(c)};
  v.es = (unsigned)a->dtype < COLL_DTYPE_COUNT ? coll_dtype_size(a->dtype) : 1;
  v.width = V_HEAD + (size_t)v.size; /* one width for every kind: a row's size never differs */
  v.rows = calloc((size_t)v.size * v.width, sizeof *v.rows);
  v.counts = calloc((size_t)v.size, sizeof *v.counts);
  int64_t *mine = calloc(v.width, sizeof *mine);
  int rc = v.rows && v.counts && mine ? 0 : v_no_memory(&v);
  if (rc == 0) {
    v_row(&v, mine);
    coll_args_t g = {.kind = COLL_ALLGATHER, .dtype = COLL_INT64, .count = v.width, .send = mine, .recv = v.rows};
    rc = coll_run(c, &g);
  }
  if (rc == 0 && (rc = v_verdict(&v)) == COLL_EMISMATCH) coll__keep_text(c, v.text);
  if (rc == 0 && v.widest) rc = v_move(&v);
  free(mine);
  free(v.rows);
  free(v.counts);
  return rc;
}
