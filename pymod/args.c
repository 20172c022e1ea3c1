/*
 * args.c - a collective's arguments from Python objects: the buffers held for the call, and
 * their shapes checked against the collective's (count = elements per rank's contribution), for
 * every communicator (_core.c), on one node or across nodes.
 */
#include "core.h"

static int hb_elems(hb_state_t *st, const hb_buf_t *b, const char *name, size_t *count) {
  (void)st;
  size_t es = coll_dtype_size(b->dtype);
  if (b->nbytes % es) {
    hb_bad_arg("%s: %zu bytes is not a whole number of %s elements", name,
                 b->nbytes, coll_dtype_name(b->dtype));
    return -1;
  }
  *count = b->nbytes / es;
  return 0;
}

/* Shapes per collective (count = elements per rank's contribution). */
int hb_prepare(hb_state_t *st, int size, int rank, int kind, PyObject *send, PyObject *recv, int op,
               int root, coll_args_t *a, hb_buf_t *sb, hb_buf_t *rb) {
  memset(sb, 0, sizeof *sb);
  memset(rb, 0, sizeof *rb);
  memset(a, 0, sizeof *a);
  if (kind < 0 || kind >= COLL_KIND_COUNT) {
    hb_bad_arg("unknown collective");
    return -1;
  }
  if (op < 0 || op >= COLL_OP_COUNT) {
    hb_bad_arg("unknown reduction op");
    return -1;
  }
  if (root < 0 || root >= size) {
    hb_bad_arg("root %d is not a rank of this communicator (size %d)", root, size);
    return -1;
  }
  a->kind = (coll_kind_t)kind;
  a->op = (coll_op_t)op;
  a->root = root;
  if (kind == COLL_BARRIER) return 0;
  int is_root = rank == root;
  int want_send = send != Py_None, want_recv = recv != Py_None;
  int same = want_send && want_recv && send == recv; /* in place: one look at the buffer */
  if (want_send && !same && hb_buf_get(send, 0, "buf", sb) != 0) goto fail;
  if (want_recv && hb_buf_get(recv, 1, kind == COLL_BCAST || same ? "buf" : "out", rb) != 0) goto fail;
  if (same) hb_buf_alias(sb, rb);
  size_t scount = 0, rcount = 0;
  if (want_send && hb_elems(st, sb, "buf", &scount) != 0) goto fail;
  if (want_recv && hb_elems(st, rb, "out", &rcount) != 0) goto fail;
  if (want_send && want_recv && sb->dtype != rb->dtype) {
    PyErr_Format(PyExc_TypeError, "buf is %s but out is %s", coll_dtype_name(sb->dtype),
                 coll_dtype_name(rb->dtype));
    goto fail;
  }
  a->dtype = want_send ? sb->dtype : rb->dtype;
  a->send = sb->ptr;
  a->recv = rb->ptr;
  size_t P = (size_t)size;
  const char *shape_err = NULL;
  switch (kind) {
  case COLL_BCAST:
    a->count = rcount;
    if (!want_recv) shape_err = "bcast needs a buffer";
    break;
  case COLL_ALLREDUCE:
  case COLL_REDUCE:
    a->count = scount;
    if (want_recv && rcount != scount) shape_err = "out must have as many elements as buf";
    if (!want_recv && (kind == COLL_ALLREDUCE || is_root)) shape_err = "out is missing";
    break;
  case COLL_GATHER:
  case COLL_ALLGATHER:
    a->count = scount;
    if (want_recv && rcount != scount * P) shape_err = "out must hold size x buf elements";
    if (!want_recv && (kind == COLL_ALLGATHER || is_root)) shape_err = "out is missing";
    break;
  case COLL_SCATTER:
    a->count = rcount;
    if (is_root && (!want_send || scount != rcount * P)) shape_err = "on the root, buf must hold size x out elements";
    if (!want_recv) shape_err = "out is missing";
    break;
  case COLL_REDUCE_SCATTER:
    a->count = rcount;
    if (!want_recv || scount != rcount * P) shape_err = "buf must hold size x out elements";
    break;
  case COLL_ALLTOALL:
    a->count = scount / P;
    if (scount % P) shape_err = "buf must hold a multiple of size elements";
    else if (!want_recv || rcount != scount) shape_err = "out must have as many elements as buf";
    break;
  }
  if (shape_err) {
    hb_bad_arg("%s: %s", coll_kind_name(a->kind), shape_err);
    goto fail;
  }
  return 0;
fail:
  hb_buf_release(sb);
  hb_buf_release(rb);
  return -1;
}
