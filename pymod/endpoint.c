/*
 * endpoint.c - hbmcoll._core.Endpoint: a bridge endpoint (libcoll/src/net.h) with its raw
 * calls, for the memory servers and their clients (hbmcoll/memserver.py, remote.py): a pool
 * registered once, notified one-sided writes out of it into a peer's pool, and polls for the
 * peers' notes.
 *
 *   e = Endpoint(iface=None, pool_bytes=4 << 20)
 *   e.describe() -> str; e.card() -> bytes; e.add_peer(card) -> int; e.pool() -> memoryview
 *   e.write(peer, frm, to, length, note, timeout=0)  # my pool [frm, frm+length) -> peer's at `to`
 *   e.poll(timeout) -> note or None        # waits up to timeout s for a peer's note
 *   e.flush(timeout=0); e.watch(fd, what); e.close()
 *
 * One thread at a time (the caller's lock); the calls that wait run without the GIL.
 */
#include "core.h"

#include <string.h>
#include <time.h>

#include "coll_internal.h" /* coll__axpy */
#include "net.h"

typedef struct {
  PyObject_HEAD
  coll__net_t *net;
  int busy;
} hb_endpoint_t;

static hb_state_t *endpoint_state(PyObject *self) { return PyType_GetModuleState(Py_TYPE(self)); }

static PyObject *endpoint_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"iface", "pool_bytes", NULL};
  const char *iface = NULL;
  Py_ssize_t pool_bytes = 4 << 20;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zn", names, &iface, &pool_bytes)) return NULL;
  if (pool_bytes < 65536) return hb_bad_arg("an endpoint pool of %zd bytes: give at least 65536", pool_bytes);
  char err[320] = "";
  coll__net_t *net = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll__net_open(iface, (size_t)pool_bytes, &net, err, sizeof err);
  Py_END_ALLOW_THREADS
  hb_endpoint_t *self = rc ? NULL : (hb_endpoint_t *)type->tp_alloc(type, 0);
  if (self == NULL) {
    coll__net_close(net);
    return rc ? hb_raise(PyType_GetModuleState(type), rc, err) : NULL;
  }
  self->net = net;
  coll__net_set_interrupt(net, hb_interrupt, NULL); /* Ctrl-C ends a wait */
  return (PyObject *)self;
}

static void endpoint_dealloc(hb_endpoint_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  coll__net_close(self->net);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static int endpoint_usable(hb_endpoint_t *self) {
  if (self->net == NULL) {
    hb_raise(endpoint_state((PyObject *)self), COLL_EBADARG, "the endpoint is closed");
    return 0;
  }
  if (self->busy) {
    hb_bad_arg("the endpoint is in use by another thread");
    return 0;
  }
  return 1;
}

static PyObject *endpoint_describe(hb_endpoint_t *self, PyObject *unused) {
  (void)unused;
  return endpoint_usable(self) ? PyUnicode_FromString(coll__net_describe(self->net)) : NULL;
}

static PyObject *endpoint_card(hb_endpoint_t *self, PyObject *unused) {
  (void)unused;
  if (!endpoint_usable(self)) return NULL;
  uint8_t card[COLL_NET_CARD_MAX];
  size_t len = coll__net_card(self->net, card);
  return PyBytes_FromStringAndSize((const char *)card, (Py_ssize_t)len);
}

static PyObject *endpoint_add_peer(hb_endpoint_t *self, PyObject *card) {
  char *bytes;
  Py_ssize_t len;
  if (!endpoint_usable(self) || PyBytes_AsStringAndSize(card, &bytes, &len) != 0) return NULL;
  char err[320] = "";
  int peer = -1, rc = coll__net_add_peer(self->net, (const uint8_t *)bytes, (size_t)len, &peer, err, sizeof err);
  if (rc) return hb_raise(endpoint_state((PyObject *)self), rc, err[0] ? err : "not a card of this provider");
  return PyLong_FromLong(peer);
}

static PyObject *endpoint_pool(hb_endpoint_t *self, PyObject *unused) {
  (void)unused;
  if (!endpoint_usable(self)) return NULL;
  return PyMemoryView_FromMemory((char *)coll__net_pool(self->net), (Py_ssize_t)coll__net_pool_bytes(self->net),
                                 PyBUF_WRITE);
}

static PyObject *endpoint_watch(hb_endpoint_t *self, PyObject *args) {
  int fd;
  const char *what;
  if (!PyArg_ParseTuple(args, "is", &fd, &what) || !endpoint_usable(self)) return NULL;
  coll__net_watch(self->net, fd, what);
  Py_RETURN_NONE;
}

/* write(peer, frm, to, length, note, timeout=0): a write the provider keeps refusing (a peer that
 * stopped reading) fails after timeout seconds (0: never). */
static PyObject *endpoint_write(hb_endpoint_t *self, PyObject *args) {
  int peer;
  Py_ssize_t frm, to, length;
  unsigned long note;
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "innnk|d", &peer, &frm, &to, &length, &note, &timeout) || !endpoint_usable(self))
    return NULL;
  coll__net_set_timeout(self->net, timeout);
  size_t pool = coll__net_pool_bytes(self->net);
  if (frm < 0 || length < 1 || to < 0 || (size_t)frm + (size_t)length > pool)
    return hb_bad_arg("write: [%zd, %zd + %zd) is not in my pool of %zu bytes", frm, frm, length, pool);
  char err[320] = "";
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  rc = coll__net_write(self->net, peer, (size_t)frm, (size_t)to, (size_t)length, (uint32_t)note, NULL, err,
                       sizeof err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL;
  if (rc) return hb_raise(endpoint_state((PyObject *)self), rc, err[0] ? err : NULL);
  Py_RETURN_NONE;
}

static double endpoint_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* poll(timeout): a peer's note, or None once timeout seconds passed without one (0: look once). */
static PyObject *endpoint_poll(hb_endpoint_t *self, PyObject *args) {
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "|d", &timeout) || !endpoint_usable(self)) return NULL;
  char err[320] = "";
  uint32_t note = 0;
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  double until = endpoint_now() + timeout;
  unsigned spins = 0;
  while ((rc = coll__net_poll(self->net, &note, err, sizeof err)) == 0) {
    coll__net_idle(++spins);
    if ((spins & 255) == 0 && (endpoint_now() > until || coll__net_interrupted(self->net))) break;
  }
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == 0 && PyErr_Occurred()) return NULL; /* KeyboardInterrupt */
  if (rc < 0) return hb_raise(endpoint_state((PyObject *)self), rc, err[0] ? err : NULL);
  if (rc == 0) Py_RETURN_NONE;
  return PyLong_FromUnsignedLong(note);
}

static PyObject *endpoint_flush(hb_endpoint_t *self, PyObject *args) {
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "|d", &timeout) || !endpoint_usable(self)) return NULL;
  char err[320] = "";
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  coll__net_set_timeout(self->net, timeout);
  rc = coll__net_flush(self->net, err, sizeof err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL;
  if (rc) return hb_raise(endpoint_state((PyObject *)self), rc, err[0] ? err : NULL);
  Py_RETURN_NONE;
}

static PyObject *endpoint_close(hb_endpoint_t *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return hb_bad_arg("the endpoint is in use by another thread");
  coll__net_close(self->net);
  self->net = NULL;
  Py_RETURN_NONE;
}

static PyMethodDef endpoint_methods[] = {
    {"describe", (PyCFunction)endpoint_describe, METH_NOARGS, "provider, fabric and interface, one line"},
    {"card", (PyCFunction)endpoint_card, METH_NOARGS, "this endpoint's card (bytes) for its peers"},
    {"add_peer", (PyCFunction)endpoint_add_peer, METH_O, "add_peer(card) -> peer number"},
    {"pool", (PyCFunction)endpoint_pool, METH_NOARGS, "the registered pool, a writable memoryview"},
    {"watch", (PyCFunction)endpoint_watch, METH_VARARGS, "watch(fd, what): a closed fd ends every wait"},
    {"write", (PyCFunction)endpoint_write, METH_VARARGS,
     "write(peer, frm, to, length, note, timeout=0): my pool's bytes into the peer's, with a 32-bit note"},
    {"poll", (PyCFunction)endpoint_poll, METH_VARARGS, "poll(timeout=0) -> a peer's note, or None"},
    {"flush", (PyCFunction)endpoint_flush, METH_VARARGS, "flush(timeout=0): until my writes completed"},
    {"close", (PyCFunction)endpoint_close, METH_NOARGS, "release the endpoint"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot endpoint_slots[] = {{Py_tp_new, endpoint_new},
                                       {Py_tp_dealloc, endpoint_dealloc},
                                       {Py_tp_methods, endpoint_methods},
                                       {Py_tp_doc, "a bridge endpoint with its raw calls (memory servers)"},
                                       {0, NULL}};

PyType_Spec hb_endpoint_spec = {"hbmcoll._core.Endpoint", sizeof(hb_endpoint_t), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, endpoint_slots};

/* axpy(y, x, alpha, dtype): y += alpha * x over raw bytes holding elements of dtype (a name:
 * "float32", "bfloat16", ...), without the GIL (the servers' accumulate). */
PyObject *hb_axpy(PyObject *m, PyObject *args) {
  Py_buffer y = {0}, x = {0};
  double alpha;
  const char *name;
  if (!PyArg_ParseTuple(args, "w*y*ds", &y, &x, &alpha, &name)) return NULL;
  coll_dtype_t dtype = COLL_DTYPE_COUNT;
  for (int d = 0; d < COLL_DTYPE_COUNT; d++)
    if (strcmp(coll_dtype_name((coll_dtype_t)d), name) == 0) dtype = (coll_dtype_t)d;
  int rc = COLL_EBADARG;
  size_t es = dtype < COLL_DTYPE_COUNT ? coll_dtype_size(dtype) : 0;
  if (es && y.len == x.len && y.len % (Py_ssize_t)es == 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = coll__axpy(dtype, y.buf, x.buf, alpha, (size_t)y.len / es);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&y), PyBuffer_Release(&x);
  if (rc) return hb_raise(PyModule_GetState(m), rc,
                          "axpy: y and x must be as long, of float16, bfloat16, float32, float64, or int32 with "
                          "an integer alpha");
  Py_RETURN_NONE;
}
