/*
 * join.c - a job across nodes from Python: _core.join_nodes turns the node's Comm into the job's
 * (libcoll/src/nodes_join.c: the nodes meet, check the layout and build the rings), and
 * Comm.span() says who is where on such a communicator.
 *
 *   job = _core.join_nodes(node, rank, size, name, secret, addr, ports, listener, iface, family,
 *                          timeout, wait)
 *   job.span() -> (node, nodes, rings, node_of, local_of, bridge) or None on one node's communicator
 *
 * node is taken (it is closed once join_nodes returns), except after a failure every rank of the
 * node shares (local rank 0 could not meet the other nodes): then it stays node's, so its ranks
 * can wait for each other before they exit.
 */
#include "core.h"

#include <stdio.h>
#include <stdlib.h>

#include "coll_internal.h"
#include "nodes.h"

static int join_ports(PyObject *seq, int **ports_p, int *n_p) {
  PyObject *fast = PySequence_Fast(seq, "join_nodes: ports must be a sequence of ints");
  if (fast == NULL) return -1;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  int *ports = malloc((size_t)(n ? n : 1) * sizeof *ports);
  for (Py_ssize_t i = 0; ports && i < n; i++) {
    long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(fast, i));
    if (v <= 0 || v > 65535) {
      if (!PyErr_Occurred()) hb_bad_arg("join_nodes: port %ld is out of range", v);
      free(ports), ports = NULL;
    } else {
      ports[i] = (int)v;
    }
  }
  Py_DECREF(fast);
  if (ports == NULL) return PyErr_Occurred() ? -1 : (PyErr_NoMemory(), -1);
  if (n == 0) {
    free(ports);
    hb_bad_arg("join_nodes: give ring 0's port at least");
    return -1;
  }
  *ports_p = ports, *n_p = (int)n;
  return 0;
}

PyObject *hb_join_nodes(PyObject *module, PyObject *args, PyObject *kw) {
  static char *names[] = {"node", "rank", "size", "name", "secret", "addr", "ports", "listener", "iface",
                          "family", "timeout", "wait", NULL};
  hb_state_t *st = PyModule_GetState(module);
  PyObject *node_obj, *port_seq;
  coll__nodes_join_t cfg = {0};
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!iisssOisidd", names, st->CommType, &node_obj, &cfg.rank,
                                   &cfg.size, &cfg.name, &cfg.secret, &cfg.addr, &port_seq, &cfg.listener,
                                   &cfg.iface, &cfg.family, &cfg.timeout_s, &cfg.wait_s))
    return NULL;
  hb_comm_t *node = (hb_comm_t *)node_obj;
  int *ports = NULL;
  if (join_ports(port_seq, &ports, &cfg.nports) != 0) return NULL;
  cfg.ports = ports;
  if (node->comm == NULL || hb_comm_lock(node) != 0) {
    free(ports);
    return node->comm == NULL ? hb_bad_arg("join_nodes: the node's communicator is closed") : NULL;
  }
  coll_comm_t *c = node->comm, *job = NULL, *back = NULL;
  node->comm = NULL; /* taken */
  cfg.node_back = &back;
  char err[COLL__NODES_TEXT] = "";
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll__nodes_join(c, &cfg, &job, err, sizeof err);
  Py_END_ALLOW_THREADS
  node->comm = back; /* a failure the node's ranks share: they still have their communicator */
  hb_comm_unlock(node);
  free(ports);
  if (rc != 0) {
    if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL; /* KeyboardInterrupt */
    return hb_raise(st, rc, err[0] ? err : NULL);
  }
  return hb_comm_wrap(st, job, node->placement, 0);
}

PyObject *hb_comm_span(hb_comm_t *self, PyObject *unused) {
  (void)unused;
  coll_comm_t *c = self->comm;
  if (c == NULL || c->span == NULL) Py_RETURN_NONE;
  int node, nodes, rings, size = coll_comm_size(c);
  const int *node_of, *local_of;
  coll__span_layout(c, &node, &nodes, &rings, &node_of, &local_of);
  PyObject *where = PyTuple_New(size), *local = PyTuple_New(size);
  int ok = where && local;
  for (int r = 0; ok && r < size; r++) { /* a NULL item (no memory) is left NULL: the tuple is dropped */
    PyObject *w = PyLong_FromLong(node_of[r]), *l = PyLong_FromLong(local_of[r]);
    PyTuple_SET_ITEM(where, r, w);
    PyTuple_SET_ITEM(local, r, l);
    ok = w && l;
  }
  PyObject *out = ok ? Py_BuildValue("(iiiOOs)", node, nodes, rings, where, local, coll__span_describe(c)) : NULL;
  Py_XDECREF(where);
  Py_XDECREF(local);
  return out;
}
