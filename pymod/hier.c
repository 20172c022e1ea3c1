/*
 * hier.c - hbmcoll._core.Hier: a job's collectives across nodes in C (libcoll/src/hier.h), for
 * the communicator across nodes (hbmcoll/nodes/communicator.py), which keeps the rendezvous, the watched
 * connections and the endpoints.
 *
 *   h = Hier(comm, bridge, node, nodes, rings, node_of, local_of, timeout=0, watch_fd=-1)
 *        # comm: this node's Comm; bridge: the Bridge whose ring this rank carries, or None;
 *        # watch_fd: the connection to the other nodes that a failure shuts
 *   h.run(kind, send=None, recv=None, op=0, root=0)   # as Comm.run, over every rank of the job
 *   h.start(kind, send=None, recv=None, op=0, root=0) -> Request   # as Comm.start
 *   h.quiet()       # until every started call finished (before the node's communicator splits)
 *   h.fail()        # end the job's communicator (an abort); h.algorithm() -> str; h.close()
 *   h.p2p(iface=None, family=0) -> Comm   # collective: a communicator over this layer for
 *        # send/recv (libcoll/src/nodes_p2p.c); close it before h
 *
 * Calls run in call order on every rank: started ones on the layer's request engine (libcoll's
 * own), a blocking one in the caller's thread, behind them if any are queued. A blocking call
 * holds the node communicator's lock and the bridge for its length, without the GIL.
 */
#include "core.h"

#include <stdio.h>
#include <time.h>

#include "hier.h"
#include "nodes.h"

typedef struct {
  PyObject_HEAD
  coll__hier_t *hier;
  PyObject *comm;   /* the node's Comm, kept alive */
  PyObject *bridge; /* the Bridge, or NULL */
  hb_state_t *state;
} hb_hier_t;

static int hier_ints(PyObject *seq, int n, int *out, const char *name) {
  PyObject *fast = PySequence_Fast(seq, "node_of and local_of are sequences of ints");
  if (fast == NULL) return -1;
  int rc = 0;
  if (PySequence_Fast_GET_SIZE(fast) != n) {
    hb_bad_arg("%s has %zd entries for %d ranks", name, PySequence_Fast_GET_SIZE(fast), n);
    rc = -1;
  }
  for (int i = 0; i < n && rc == 0; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v == -1 && PyErr_Occurred()) rc = -1;
    out[i] = (int)v;
  }
  Py_DECREF(fast);
  return rc;
}

static PyObject *hier_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"comm", "bridge", "node", "nodes", "rings", "node_of", "local_of", "timeout", "watch_fd",
                          NULL};
  hb_state_t *st = PyType_GetModuleState(type);
  PyObject *comm, *bridge, *node_of, *local_of;
  int node, nodes, rings, watch_fd = -1;
  double timeout = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!OiiiOO|di", names, st->CommType, &comm, &bridge, &node, &nodes,
                                   &rings, &node_of, &local_of, &timeout, &watch_fd))
    return NULL;
  if (bridge != Py_None && !PyObject_TypeCheck(bridge, st->BridgeType))
    return PyErr_Format(PyExc_TypeError, "bridge must be a Bridge or None");
  hb_comm_t *c = (hb_comm_t *)comm;
  if (c->comm == NULL) return hb_raise(st, COLL_EABORTED, "the node's communicator is closed");
  Py_ssize_t size = PySequence_Size(node_of);
  if (size < 1 || size > (1 << 24)) return size < 0 ? NULL : hb_bad_arg("a job of %zd ranks", size);
  int *where = PyMem_Malloc(2 * (size_t)size * sizeof(int));
  if (where == NULL) return PyErr_NoMemory();
  hb_hier_t *self = NULL;
  coll__hier_config_t cfg = {.local = c->comm, .nodes = nodes, .node = node, .rings = rings, .size = (int)size,
                             .node_of = where, .local_of = where + size, .timeout_s = timeout,
                             .watch_fd = watch_fd};
  if (hier_ints(node_of, (int)size, where, "node_of") == 0 && hier_ints(local_of, (int)size, where + size, "local_of") == 0) {
    if (bridge != Py_None) {
      cfg.ring = hb_bridge_take(bridge);
      if (cfg.ring) hb_bridge_give(bridge);
    }
    if (bridge == Py_None || cfg.ring != NULL) {
      char err[320] = "";
      coll__hier_t *h = NULL;
      int rc = coll__hier_make(&cfg, &h, err, sizeof err);
      if (rc) {
        hb_raise(st, rc, err[0] ? err : NULL);
      } else if ((self = (hb_hier_t *)type->tp_alloc(type, 0)) == NULL) {
        coll__hier_free(h);
      } else {
        self->hier = h, self->state = st;
        self->comm = Py_NewRef(comm);
        self->bridge = bridge == Py_None ? NULL : Py_NewRef(bridge);
      }
    }
  }
  PyMem_Free(where);
  return (PyObject *)self;
}

static void hier_close_parts(hb_hier_t *self) {
  coll__hier_free(self->hier);
  self->hier = NULL;
  Py_CLEAR(self->comm);
  Py_CLEAR(self->bridge);
}

static void hier_dealloc(hb_hier_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  hier_close_parts(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyObject *hier_close(hb_hier_t *self, PyObject *unused) {
  (void)unused;
  hier_close_parts(self);
  Py_RETURN_NONE;
}

static PyObject *hier_algorithm(hb_hier_t *self, PyObject *unused) {
  (void)unused;
  return PyUnicode_FromString(coll__hier_algorithm(self->hier));
}

static int hier_parse(hb_hier_t *self, PyObject *args, coll_args_t *a, hb_buf_t *sb, hb_buf_t *rb) {
  int kind, op = 0, root = 0;
  PyObject *send = Py_None, *recv = Py_None;
  if (!PyArg_ParseTuple(args, "i|OOii", &kind, &send, &recv, &op, &root)) return -1;
  if (self->hier == NULL) {
    hb_raise(self->state, COLL_EABORTED, "the communicator across nodes is closed");
    return -1;
  }
  return hb_prepare(self->state, self->hier->cfg.size, coll__hier_rank(self->hier), kind, send, recv, op, root, a,
                    sb, rb);
}

/* Wait for a started call in slices, running Python's signal handlers between them: Ctrl-C
 * ends the job's communicator (so the call ends too) and raises. 0 and *result_p, or -1. */
static int hier_wait(hb_hier_t *self, coll_req_t *req, int *result_p) {
  for (;;) {
    int fin, result = 0;
    Py_BEGIN_ALLOW_THREADS
    coll_req_wait(req, 0.05);
    fin = coll_req_test(req, &result);
    Py_END_ALLOW_THREADS
    if (fin) {
      *result_p = result;
      return 0;
    }
    if (PyErr_CheckSignals() < 0) {
      coll__hier_fail(self->hier, COLL_EINTERRUPTED, "a rank was interrupted by a signal; the communicator is closed");
      Py_BEGIN_ALLOW_THREADS
      coll_req_wait(req, -1);
      Py_END_ALLOW_THREADS
      return -1;
    }
  }
}

static PyObject *hier_run(hb_hier_t *self, PyObject *args) {
  coll_args_t a;
  hb_buf_t sb, rb;
  if (hier_parse(self, args, &a, &sb, &rb) != 0) return NULL;
  hb_comm_t *c = (hb_comm_t *)self->comm;
  PyObject *result = NULL;
  char err[320] = "";
  int rc = 0, done = 0;
  if (coll__hier_pending(self->hier)) { /* behind the started calls, on the engine */
    coll_req_t *req = NULL;
    rc = coll__hier_start(self->hier, &a, &req, err, sizeof err);
    if (rc == 0) {
      done = hier_wait(self, req, &rc) == 0 ? 1 : -1;
      coll_req_free(req);
      const char *text = NULL;
      if (rc && coll__hier_failure(self->hier, &text) == rc) snprintf(err, sizeof err, "%s", text);
    }
  } else if (hb_comm_lock(c) == 0) {
    struct coll__net_ring *ring = self->bridge ? hb_bridge_take(self->bridge) : NULL;
    if (self->bridge == NULL || ring == self->hier->cfg.ring) {
      Py_BEGIN_ALLOW_THREADS
      rc = coll__hier_run(self->hier, &a, err, sizeof err);
      Py_END_ALLOW_THREADS
      done = 1;
    } else if (ring != NULL) {
      hb_bad_arg("the bridge's ring changed under the communicator across nodes");
    }
    if (ring) hb_bridge_give(self->bridge);
    hb_comm_unlock(c);
  }
  if (done == 1 && rc == 0) result = Py_NewRef(Py_None);
  else if (done == 1 && !(rc == COLL_EINTERRUPTED && PyErr_Occurred())) hb_raise(self->state, rc, err[0] ? err : NULL);
  hb_buf_release(&sb);
  hb_buf_release(&rb);
  return result;
}

static PyObject *hier_start(hb_hier_t *self, PyObject *args) {
  coll_args_t a;
  hb_buf_t sb, rb;
  if (hier_parse(self, args, &a, &sb, &rb) != 0) return NULL;
  char err[320] = "";
  coll_req_t *req = NULL;
  int rc = coll__hier_start(self->hier, &a, &req, err, sizeof err);
  if (rc == 0) return hb_request_new((hb_comm_t *)self->comm, req, &sb, &rb); /* takes the buffers */
  hb_buf_release(&sb);
  hb_buf_release(&rb);
  return hb_raise(self->state, rc, err[0] ? err : NULL);
}

static PyObject *hier_quiet(hb_hier_t *self, PyObject *unused) {
  (void)unused;
  while (self->hier && coll__hier_pending(self->hier)) {
    Py_BEGIN_ALLOW_THREADS
    struct timespec nap = {0, 2000000};
    nanosleep(&nap, NULL);
    Py_END_ALLOW_THREADS
    if (PyErr_CheckSignals() < 0) return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject *hier_fail(hb_hier_t *self, PyObject *unused) {
  (void)unused;
  if (self->hier) coll__hier_fail(self->hier, COLL_EABORTED, "a rank aborted the communicator across nodes");
  Py_RETURN_NONE;
}

/* Collective: the layer's face as a communicator (nodes_comm.c, borrowing the layer and its parts),
 * whose point-to-point calls cross the nodes in C; its cards are allgathered through the layer. */
static PyObject *hier_p2p(hb_hier_t *self, PyObject *args) {
  const char *iface = NULL;
  int family = 0;
  if (!PyArg_ParseTuple(args, "|zi", &iface, &family)) return NULL;
  if (self->hier == NULL) return hb_raise(self->state, COLL_EABORTED, "the communicator across nodes is closed");
  hb_comm_t *c = (hb_comm_t *)self->comm;
  const coll__hier_config_t *hc = &self->hier->cfg;
  coll__span_config_t sc = {.local = c->comm, .ring = hc->ring, .nodes = hc->nodes, .node = hc->node,
                            .rings = hc->rings, .size = hc->size, .node_of = self->hier->node_of,
                            .local_of = self->hier->local_of, .timeout_s = hc->timeout_s, .iface = iface,
                            .family = family, .hier = self->hier, .watch_fd = hc->watch_fd};
  if (hb_comm_lock(c) != 0) return NULL;
  struct coll__net_ring *ring = self->bridge ? hb_bridge_take(self->bridge) : NULL;
  coll_comm_t *face = NULL;
  char err[320] = "";
  int rc = COLL_EBADARG;
  if (self->bridge == NULL || ring == hc->ring) {
    Py_BEGIN_ALLOW_THREADS
    rc = coll__comm_span(&sc, &face, err, sizeof err);
    Py_END_ALLOW_THREADS
  } else if (ring != NULL) {
    snprintf(err, sizeof err, "the bridge's ring changed under the communicator across nodes");
  }
  if (ring) hb_bridge_give(self->bridge);
  hb_comm_unlock(c);
  if (rc) return PyErr_Occurred() ? NULL : hb_raise(self->state, rc, err[0] ? err : NULL);
  return hb_comm_wrap(self->state, face, NULL, 1, (PyObject *)self);
}

static PyMethodDef hier_methods[] = {
    {"p2p", (PyCFunction)hier_p2p, METH_VARARGS, "p2p(iface=None, family=0) -> Comm: collective; send/recv across "
                                                 "the nodes in C (close it before this layer)"},
    {"run", (PyCFunction)hier_run, METH_VARARGS, "run(kind, send=None, recv=None, op=0, root=0): a collective "
                                                 "over every rank of the job"},
    {"start", (PyCFunction)hier_start, METH_VARARGS, "start(kind, send=None, recv=None, op=0, root=0) -> Request"},
    {"quiet", (PyCFunction)hier_quiet, METH_NOARGS, "until every started call finished"},
    {"fail", (PyCFunction)hier_fail, METH_NOARGS, "end the job's communicator on every rank"},
    {"algorithm", (PyCFunction)hier_algorithm, METH_NOARGS, "the path the last call took"},
    {"close", (PyCFunction)hier_close, METH_NOARGS, "release the layer (before the bridge closes)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot hier_slots[] = {{Py_tp_new, hier_new},
                                   {Py_tp_dealloc, hier_dealloc},
                                   {Py_tp_methods, hier_methods},
                                   {Py_tp_doc, "a job's collectives across nodes"},
                                   {0, NULL}};

PyType_Spec hb_hier_spec = {"hbmcoll._core.Hier", sizeof(hb_hier_t), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
                            hier_slots};
