/*
 * bridge.c - hbmcoll._core.Bridge: an endpoint of the bridge between nodes (libcoll/src/net.h) for
 * the memory servers and their clients (hbmcoll/memserver/), which swap the cards themselves.
 *
 *   b = Bridge(iface=None, pool_bytes=4 << 20, pool=None)   # opens the endpoint (loads libfabric);
 *                                    # pool: a writable buffer to register instead (kept until close)
 *   b.describe() -> str; b.card() -> bytes; b.add_peer(card) -> int
 *   b.watch(fd, what)
 *   b.pool() -> memoryview; b.write(peer, frm, to, length, note, timeout=0)   # the raw calls
 *   b.poll(timeout) -> note or None; b.flush(timeout=0)                       # (memory servers)
 *   b.dropped() -> int: notes refused (from no peer of this endpoint)
 *   b.close()
 *
 * One thread at a time (the caller's lock); every call that can block runs without the
 * GIL, on the C fields only.
 */
#include "core.h"

#include <errno.h>
#include <sys/socket.h>
#include <time.h>

#include "net.h"

typedef struct {
  PyObject_HEAD
  coll__net_t *net;
  int busy;
  Py_buffer pool; /* the caller's pool (pool.obj NULL: the endpoint's own) */
} hb_bridge_t;

static hb_state_t *bridge_state(PyObject *self) { return PyType_GetModuleState(Py_TYPE(self)); }

static PyObject *bridge_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"iface", "pool_bytes", "pool", "family", NULL};
  const char *iface = NULL;
  Py_ssize_t pool_bytes = 4 << 20;
  PyObject *pool_obj = Py_None;
  int family = AF_UNSPEC; /* the job's addresses' (socket.AF_INET6: the interface's IPv6 address) */
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|znOi", names, &iface, &pool_bytes, &pool_obj, &family)) return NULL;
  if (family != AF_UNSPEC && family != AF_INET && family != AF_INET6)
    return hb_bad_arg("a bridge's family is socket.AF_INET, AF_INET6 or 0, not %d", family);
  Py_buffer pool = {0};
  if (pool_obj != Py_None) {
    if (PyObject_GetBuffer(pool_obj, &pool, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) return NULL;
    pool_bytes = pool.len;
  }
  if (pool_bytes < 65536) {
    if (pool.obj) PyBuffer_Release(&pool);
    return hb_bad_arg("a bridge pool of %zd bytes: give at least 65536", pool_bytes);
  }
  char err[320] = "";
  coll__net_t *net = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll__net_open_on(iface, family, pool.obj ? pool.buf : NULL, (size_t)pool_bytes, &net, err, sizeof err);
  Py_END_ALLOW_THREADS
  hb_bridge_t *self = rc ? NULL : (hb_bridge_t *)type->tp_alloc(type, 0);
  if (self == NULL) {
    coll__net_close(net);
    if (pool.obj) PyBuffer_Release(&pool);
    return rc ? hb_raise(PyType_GetModuleState(type), rc, err) : NULL;
  }
  self->net = net;
  self->pool = pool;
  coll__net_set_interrupt(net, hb_interrupt, NULL); /* Ctrl-C ends a wait on another node */
  return (PyObject *)self;
}

static void bridge_free_parts(hb_bridge_t *self) {
  coll__net_close(self->net);
  self->net = NULL;
  if (self->pool.obj) PyBuffer_Release(&self->pool); /* after the endpoint let go of it */
}

static void bridge_dealloc(hb_bridge_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  bridge_free_parts(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

/* NULL with an error unless the endpoint is open and no other call is running. */
/* The endpoint (NULL once closed), for the memory server's data path (memserve.c), which
 * keeps the Bridge object alive. */
coll__net_t *hb_bridge_net(PyObject *bridge) { return ((hb_bridge_t *)bridge)->net; }

static int bridge_usable(hb_bridge_t *self) {
  if (self->net == NULL) {
    hb_raise(bridge_state((PyObject *)self), COLL_EABORTED, "the bridge is closed");
    return 0;
  }
  if (self->busy) {
    hb_bad_arg("the bridge is in use by another thread");
    return 0;
  }
  return 1;
}


static PyObject *bridge_describe(hb_bridge_t *self, PyObject *unused) {
  (void)unused;
  if (!bridge_usable(self)) return NULL;
  return PyUnicode_FromString(coll__net_describe(self->net));
}

static PyObject *bridge_card(hb_bridge_t *self, PyObject *unused) {
  (void)unused;
  if (!bridge_usable(self)) return NULL;
  uint8_t card[COLL_NET_CARD_MAX];
  size_t len = coll__net_card(self->net, card);
  return PyBytes_FromStringAndSize((const char *)card, (Py_ssize_t)len);
}

static PyObject *bridge_add_peer(hb_bridge_t *self, PyObject *arg) {
  if (!bridge_usable(self)) return NULL;
  char *card;
  Py_ssize_t len;
  if (PyBytes_AsStringAndSize(arg, &card, &len) < 0) return NULL;
  char err[320] = "";
  int peer = -1, rc = coll__net_add_peer(self->net, (const uint8_t *)card, (size_t)len, &peer, err, sizeof err);
  if (rc) return hb_raise(bridge_state((PyObject *)self), rc, err[0] ? err : NULL);
  return PyLong_FromLong(peer);
}

static PyObject *bridge_watch(hb_bridge_t *self, PyObject *args) {
  int fd;
  const char *what;
  if (!PyArg_ParseTuple(args, "is", &fd, &what) || !bridge_usable(self)) return NULL;
  coll__net_watch(self->net, fd, what);
  Py_RETURN_NONE;
}

static PyObject *bridge_pool(hb_bridge_t *self, PyObject *unused) {
  (void)unused;
  if (!bridge_usable(self)) return NULL;
  return PyMemoryView_FromMemory((char *)coll__net_pool(self->net), (Py_ssize_t)coll__net_pool_bytes(self->net),
                                 PyBUF_WRITE);
}

/* write(peer, frm, to, length, note, timeout=0): a write the provider keeps refusing (a peer that
 * stopped reading) fails after timeout seconds (0: never). The note travels as a message behind
 * the bytes, so the peer knows who sent it (a memory server checks a note's client against it). */
static PyObject *bridge_write(hb_bridge_t *self, PyObject *args) {
  int peer;
  Py_ssize_t frm, to, length;
  unsigned long note;
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "innnk|d", &peer, &frm, &to, &length, &note, &timeout) || !bridge_usable(self))
    return NULL;
  coll__net_set_timeout(self->net, timeout);
  size_t pool = coll__net_pool_bytes(self->net);
  if (frm < 0 || length < 1 || to < 0 || (size_t)frm + (size_t)length > pool)
    return hb_bad_arg("write: [%zd, %zd + %zd) is not in my pool of %zu bytes", frm, frm, length, pool);
  char err[320] = "";
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  rc = coll__net_write_sourced(self->net, peer, (size_t)frm, (size_t)to, (size_t)length, (uint32_t)note, NULL,
                               err, sizeof err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL;
  if (rc) return hb_raise(bridge_state((PyObject *)self), rc, err[0] ? err : NULL);
  Py_RETURN_NONE;
}

double hb_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* poll(timeout): a peer's note, or None once timeout seconds passed without one (0: look once). */
static PyObject *bridge_poll(hb_bridge_t *self, PyObject *args) {
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "|d", &timeout) || !bridge_usable(self)) return NULL;
  char err[320] = "";
  uint32_t note = 0;
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  double until = hb_now() + timeout, since = 0;
  unsigned spins = 0;
  /* between empty polls, a short spin and then a sleep in the kernel (coll__net_idle) */
  while ((rc = coll__net_poll(self->net, &note, err, sizeof err)) == 0) {
    int slept = coll__net_idle(self->net, &since, until);
    if (!slept && (++spins & 15) != 0) continue;
    if (hb_now() > until || ((slept || (spins & 255) == 0) && coll__net_interrupted(self->net))) break;
  }
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == 0 && PyErr_Occurred()) return NULL; /* KeyboardInterrupt */
  if (rc < 0) return hb_raise(bridge_state((PyObject *)self), rc, err[0] ? err : NULL);
  if (rc == 0) Py_RETURN_NONE;
  return PyLong_FromUnsignedLong(note);
}

static PyObject *bridge_flush(hb_bridge_t *self, PyObject *args) {
  double timeout = 0;
  if (!PyArg_ParseTuple(args, "|d", &timeout) || !bridge_usable(self)) return NULL;
  char err[320] = "";
  int rc;
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS
  coll__net_set_timeout(self->net, timeout);
  rc = coll__net_flush(self->net, err, sizeof err);
  Py_END_ALLOW_THREADS
  self->busy = 0;
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL;
  if (rc) return hb_raise(bridge_state((PyObject *)self), rc, err[0] ? err : NULL);
  Py_RETURN_NONE;
}

static PyObject *bridge_dropped(hb_bridge_t *self, PyObject *unused) {
  (void)unused;
  if (!bridge_usable(self)) return NULL;
  return PyLong_FromUnsignedLongLong(coll__net_dropped(self->net));
}

static PyObject *bridge_close(hb_bridge_t *self, PyObject *unused) {
  (void)unused;
  if (self->busy) return hb_bad_arg("the bridge is in use by another thread");
  bridge_free_parts(self);
  Py_RETURN_NONE;
}

static PyMethodDef bridge_methods[] = {
    {"describe", (PyCFunction)bridge_describe, METH_NOARGS, "provider, fabric and interface, one line"},
    {"card", (PyCFunction)bridge_card, METH_NOARGS, "this endpoint's card (bytes) for the other nodes"},
    {"add_peer", (PyCFunction)bridge_add_peer, METH_O, "add_peer(card) -> peer number"},
    {"watch", (PyCFunction)bridge_watch, METH_VARARGS, "watch(fd, what): a closed fd is a lost node"},
    {"pool", (PyCFunction)bridge_pool, METH_NOARGS, "the registered pool, a writable memoryview"},
    {"write", (PyCFunction)bridge_write, METH_VARARGS,
     "write(peer, frm, to, length, note, timeout=0): my pool's bytes into the peer's, with a 32-bit note"},
    {"poll", (PyCFunction)bridge_poll, METH_VARARGS, "poll(timeout=0) -> a peer's note, or None"},
    {"flush", (PyCFunction)bridge_flush, METH_VARARGS, "flush(timeout=0): until my writes completed"},
    {"dropped", (PyCFunction)bridge_dropped, METH_NOARGS, "notes refused: from addresses that are no peers"},
    {"close", (PyCFunction)bridge_close, METH_NOARGS, "release the endpoint"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot bridge_slots[] = {{Py_tp_new, bridge_new},
                                     {Py_tp_dealloc, bridge_dealloc},
                                     {Py_tp_methods, bridge_methods},
                                     {Py_tp_doc, "this rank's endpoint of the bridge between nodes"},
                                     {0, NULL}};

PyType_Spec hb_bridge_spec = {"hbmcoll._core.Bridge", sizeof(hb_bridge_t), 0,
                              Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, bridge_slots};
