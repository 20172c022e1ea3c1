/*
 * vcoll.c - Comm.run_v: the collectives with a count per rank (coll_run_v) from Python objects.
 *
 * What only Python can find wrong (a buffer that is no buffer, counts that are no integers, a
 * size that is not a whole number of elements) still takes part in the call, with a dtype out of
 * range, so every rank fails together (COLL_EMISMATCH) while this one says what it found. A
 * result the caller did not pass is made by make_out(elements) once its size is known.
 */
#include "core.h"

typedef struct {
  PyObject *make_out; /* callable: elements -> a writable buffer of the send buffer's kind */
  PyObject *made;     /* what it made (a new reference), or NULL */
  hb_buf_t held;
  int has_held;
  size_t es;
} vc_alloc_t;

/* coll_run_v's alloc, called without the GIL in the calling thread. */
static void *vc_alloc(void *arg, size_t bytes) {
  vc_alloc_t *al = arg;
  void *ptr = NULL;
  PyGILState_STATE g = PyGILState_Ensure();
  if (!PyErr_Occurred()) {
    al->made = PyObject_CallFunction(al->make_out, "n", (Py_ssize_t)(bytes / al->es));
    if (al->made && hb_buf_get(al->made, 1, "out", &al->held) == 0) {
      al->has_held = 1;
      if (al->held.nbytes == bytes) ptr = al->held.ptr;
      else PyErr_Format(PyExc_ValueError, "make_out gave %zu bytes for %zu", al->held.nbytes, bytes);
    }
  }
  PyGILState_Release(g);
  return ptr;
}

/* counts (a sequence of size integers >= 0, or None) into out; 0, or a sentence in why. */
static int vc_counts(PyObject *obj, int size, size_t *out, char *why, size_t len) {
  PyObject *seq = PySequence_Fast(obj, "counts");
  if (seq == NULL || PySequence_Fast_GET_SIZE(seq) != size) {
    PyErr_Clear();
    Py_XDECREF(seq);
    snprintf(why, len, "give %d counts >= 0, one per rank", size);
    return -1;
  }
  int rc = 0;
  for (int i = 0; i < size && rc == 0; i++) {
    PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
    PyObject *index = PyNumber_Index(item);
    long long v = index ? PyLong_AsLongLong(index) : -1;
    Py_XDECREF(index);
    if (PyErr_Occurred() || v < 0) {
      PyErr_Clear();
      snprintf(why, len, "counts[%d] is %s: give %d integers >= 0", i, Py_TYPE(item)->tp_name, size);
      rc = -1;
    }
    out[i] = (size_t)v;
  }
  Py_DECREF(seq);
  return rc;
}

/* A buffer's pointer, dtype and element count, or a sentence in why (the exception cleared). */
static int vc_buf(PyObject *obj, int writable, const char *name, hb_buf_t *b, size_t *n, char *why, size_t len) {
  if (hb_buf_get(obj, writable, name, b) != 0) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    snprintf(why, len, "%s", s && PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : "a bad buffer");
    Py_XDECREF(s), Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
    PyErr_Clear();
    return -1;
  }
  size_t es = coll_dtype_size(b->dtype);
  *n = b->nbytes / es;
  if (b->nbytes % es) {
    snprintf(why, len, "%s: %zu bytes is not a whole number of %s elements", name, b->nbytes,
             coll_dtype_name(b->dtype));
    return -1;
  }
  return 0;
}

/* This rank's own reason for the disagreement every rank got. */
static void vc_refused(hb_comm_t *self, int kind, const char *why) {
  static const char *const names[COLL_KIND_COUNT] = {
      [COLL_GATHER] = "gatherv", [COLL_SCATTER] = "scatterv", [COLL_ALLGATHER] = "allgatherv",
      [COLL_REDUCE_SCATTER] = "reduce_scatter", [COLL_ALLTOALL] = "alltoallv"};
  char text[320];
  snprintf(text, sizeof text, "%s: %s", kind >= 0 && kind < COLL_KIND_COUNT && names[kind] ? names[kind] : "run_v", why);
  hb_raise(self->state, COLL_EMISMATCH, text);
}

/* run_v(kind, send, recv, counts, op, root, make_out) -> the result made by make_out, or None */
PyObject *hb_comm_run_v(hb_comm_t *self, PyObject *args) {
  int kind, op, root;
  PyObject *send, *recv, *counts_obj, *make_out;
  if (!PyArg_ParseTuple(args, "iOOOiiO", &kind, &send, &recv, &counts_obj, &op, &root, &make_out) ||
      hb_comm_usable(self) != 0 || hb_comm_lock(self) != 0)
    return NULL;
  int size = coll_comm_size(self->comm);
  char why[256] = "";
  size_t *counts = PyMem_Calloc((size_t)size, sizeof *counts);
  if (counts == NULL) {
    hb_comm_unlock(self);
    return PyErr_NoMemory();
  }
  hb_buf_t sb = {0}, rb = {0};
  vc_alloc_t al = {.make_out = make_out};
  coll_vargs_t a = {.kind = (coll_kind_t)kind, .op = (coll_op_t)op, .root = root, .alloc = vc_alloc, .alloc_arg = &al};
  if (counts_obj != Py_None && vc_counts(counts_obj, size, counts, why, sizeof why) == 0) a.counts = counts;
  /* an empty tensor may have no address: whether a buffer was given is the object, not its pointer */
  int has_send = !why[0] && send != Py_None && vc_buf(send, 0, "buf", &sb, &a.send_count, why, sizeof why) == 0;
  int has_recv = !why[0] && recv != Py_None && vc_buf(recv, 1, "out", &rb, &a.recv_count, why, sizeof why) == 0;
  static char nothing; /* where an empty buffer without an address points: never read or written */
  if (has_send) a.send = sb.ptr ? sb.ptr : &nothing;
  if (has_recv) a.recv = rb.ptr ? rb.ptr : &nothing;
  if (!why[0] && !has_send && !has_recv) snprintf(why, sizeof why, "pass out= (or buf) on every rank");
  if (!why[0] && has_send && has_recv && sb.dtype != rb.dtype)
    snprintf(why, sizeof why, "buf is %s but out is %s", coll_dtype_name(sb.dtype), coll_dtype_name(rb.dtype));
  a.dtype = has_send ? sb.dtype : rb.dtype;
  al.es = coll_dtype_size(a.dtype);
  if (why[0]) a.dtype = COLL_DTYPE_COUNT; /* out of range: every rank refuses the call with this one */
  PyObject *result = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_run_v(self->comm, &a);
  Py_END_ALLOW_THREADS
  if (PyErr_Occurred()) /* make_out raised: the call went on for the others */
    ;
  else if (rc == COLL_EMISMATCH && why[0])
    vc_refused(self, kind, why);
  else if (rc)
    hb_comm_raise(self, rc);
  else
    result = Py_NewRef(al.made ? al.made : Py_None);
  hb_comm_unlock(self);
  if (al.has_held) hb_buf_release(&al.held);
  Py_XDECREF(al.made);
  hb_buf_release(&sb);
  hb_buf_release(&rb);
  PyMem_Free(counts);
  return result;
}
