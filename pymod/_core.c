/*
 * _core.c - the hbmcoll._core extension: module state, and the Comm type wrapping a
 * libcoll communicator (multi-phase init, heap types). Codes become exceptions in
 * errors.c.
 *
 * GIL rule: buffers are acquired and arguments checked with the GIL held;
 * every call that can block runs between Py_BEGIN/END_ALLOW_THREADS and
 * touches no Python object; errors are mapped after the GIL is back. Waits
 * call hb_interrupt every few tens of ms, which takes the GIL just long
 * enough to run Python's signal handlers, so Ctrl-C ends a stuck collective.
 */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <unistd.h>

#include "coll_internal.h"
#include "nodes.h"

static hb_state_t *hb_state_of(PyObject *module) { return PyModule_GetState(module); }

/* Called by libcoll from long waits in the caller's thread (and by the bridge's). */
int hb_interrupt(void *arg) {
  (void)arg;
  PyGILState_STATE g = PyGILState_Ensure();
  int rc = PyErr_CheckSignals(); /* leaves the exception set on this thread */
  PyGILState_Release(g);
  return rc < 0;
}

/* Before a collective: the communicator must belong to this process and, unless
 * the caller orders collectives itself, to this thread. Threads racing to issue
 * collectives could pair them differently on each rank (silently wrong sums),
 * so a second thread is refused at once, on its own rank, before anything moves. */
int hb_comm_usable(hb_comm_t *self) {
  if (self->comm == NULL) return 0; /* hb_comm_lock says "closed" */
  if (coll_comm_forked(self->comm)) {
    char text[256];
    snprintf(text, sizeof text,
             "this communicator belongs to process %d; a fork()ed child (pid %d) cannot use "
             "it: call hbmcoll.init() in the child for a communicator of its own",
             coll_comm_owner_pid(self->comm), (int)getpid());
    hb_raise(self->state, COLL_EFORKED, text);
    return -1;
  }
  if (!self->any_thread && PyThread_get_thread_ident() != self->owner_thread) {
    char text[320];
    snprintf(text, sizeof text,
             "this communicator is used by thread %lu (the one that created it, or the last to "
             "call bind_thread()); collectives from thread %lu could pair up differently on each "
             "rank, so they are refused: use one communicator per thread (comm.split), or hand "
             "it over with comm.bind_thread() in the new thread",
             self->owner_thread, PyThread_get_thread_ident());
    hb_raise(self->state, COLL_ENOTSUP, text);
    return -1;
  }
  return 0;
}

PyObject *hb_comm_raise(hb_comm_t *self, int rc);
static PyObject *hb_comm_error(hb_comm_t *self, int rc) { return hb_comm_raise(self, rc); }
PyObject *hb_comm_raise(hb_comm_t *self, int rc) {
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL; /* KeyboardInterrupt */
  const char *text = NULL;
  int code = coll_comm_error(self->comm, &text);
  /* code 0: the communicator goes on (across nodes, after a disagreement), with its sentence */
  int kept = code == 0 && (rc == COLL_EMISMATCH || rc == COLL_EBADARG) && text && *text;
  return hb_raise(self->state, rc, code == rc || kept ? text : NULL);
}

/* ---- Comm ---------------------------------------------------------------- */

static PyObject *comm_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"rank", "size", "key", "timeout", "placement", NULL};
  int rank, size;
  const char *key;
  double timeout = 0;
  PyObject *placement = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iis|dO", names, &rank, &size, &key, &timeout,
                                   &placement))
    return NULL;
  hb_comm_t *self = (hb_comm_t *)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  hb_comm_lock_init(self);
  self->state = PyType_GetModuleState(type);
  self->owner_thread = PyThread_get_thread_ident();
  if (size < 1 || rank < 0 || rank >= size) {
    Py_DECREF(self);
    return hb_bad_arg("rank %d is not in range for size %d", rank, size);
  }
  coll_comm_config_t cfg = {.rank = rank, .size = size, .job_key = key, .timeout_s = timeout,
                            .interrupt = hb_interrupt};
  if (placement != Py_None) {
    if (!PyObject_TypeCheck(placement, self->state->PlacementType)) {
      Py_DECREF(self);
      return PyErr_Format(PyExc_TypeError, "placement must be a hbmcoll._core.Placement");
    }
    cfg.place = hb_placement_place;
    cfg.place_arg = hb_placement_ctx(placement);
    self->placement = Py_NewRef(placement);
  }
  coll_comm_t *comm = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_comm_create(&cfg, &comm);
  Py_END_ALLOW_THREADS
  if (rc != 0) {
    const char *text = NULL;
    if (comm) coll_comm_error(comm, &text);
    if (!(rc == COLL_EINTERRUPTED && PyErr_Occurred())) hb_raise(self->state, rc, text);
    coll_comm_free(comm);
    Py_DECREF(self);
    return NULL;
  }
  self->comm = comm;
  return (PyObject *)self;
}

/* A last give (a bcast's root, a small gather's sender) returned before the peers compared
 * their calls with it: compare now (coll_comm_settle), from any thread, as no new call
 * starts. 0, or the failure with its text copied into text (the communicator may go next). */
static int hb_settle(coll_comm_t *c, char *text, size_t len) {
  text[0] = '\0';
  if (coll_comm_forked(c) || coll_comm_error(c, NULL) != 0) return 0;
  int rc = coll_comm_settle(c);
  const char *t = NULL;
  if (rc && coll_comm_error(c, &t) == rc && t) snprintf(text, len, "%s", t);
  return rc;
}

static void comm_dealloc(hb_comm_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (self->comm) {
    coll_comm_t *c = self->comm;
    self->comm = NULL;
    char text[320];
    Py_BEGIN_ALLOW_THREADS
    /* never closed (a script that ends after its last call): a disagreement is said in one
     * line, as nothing can be raised any more */
    int rc = hb_settle(c, text, sizeof text);
    if (rc != 0)
      fprintf(stderr, "hbmcoll: rank %d: %s (found as the communicator was freed without close(); "
              "close() raises it)\n", coll_comm_rank(c), text[0] ? text : coll_strerror(rc));
    coll_comm_free(c);
    Py_END_ALLOW_THREADS
  }
  coll_comm_free(self->kept);
  self->kept = NULL;
  Py_CLEAR(self->placement);
  hb_comm_lock_destroy(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static int comm_traverse(hb_comm_t *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->placement);
  return 0;
}

/* run(kind, send=None, recv=None, op=0, root=0): the hot path, so FASTCALL
 * without building an argument tuple. The one place where kind, op and root
 * are range-checked, as Python ints, before they are narrowed to C ints. */
int hb_parse_run(hb_comm_t *self, PyObject *const *args, Py_ssize_t n, int *kind,
                 PyObject **send, PyObject **recv, int *op, int *root) {
  if (n < 1 || n > 5) {
    PyErr_SetString(PyExc_TypeError, "run/start/prepare take 1 to 5 arguments");
    return -1;
  }
  long long v[3] = {0, 0, 0};
  const int at[3] = {0, 3, 4};
  for (int i = 0; i < 3; i++) {
    if (at[i] >= n) continue;
    int overflow = 0;
    v[i] = PyLong_AsLongLongAndOverflow(args[at[i]], &overflow);
    if (v[i] == -1 && PyErr_Occurred()) return -1;
    if (overflow) v[i] = overflow < 0 ? LLONG_MIN : LLONG_MAX; /* out of every range below */
  }
  int size = self->comm ? coll_comm_size(self->comm) : 1;
  if (v[0] < 0 || v[0] >= COLL_KIND_COUNT) {
    hb_bad_arg("unknown collective");
    return -1;
  }
  if (v[1] < 0 || v[1] >= COLL_OP_COUNT) {
    hb_bad_arg("unknown reduction op");
    return -1;
  }
  if (v[2] < 0 || v[2] >= size) {
    if (at[2] < n)
      hb_bad_arg("root %R is not a rank of this communicator (size %d)",
                   args[at[2]], size);
    return -1;
  }
  *kind = (int)v[0], *op = (int)v[1], *root = (int)v[2];
  *send = n > 1 ? args[1] : Py_None;
  *recv = n > 2 ? args[2] : Py_None;
  return 0;
}

static PyObject *comm_run(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  int kind, op, root;
  PyObject *send, *recv;
  if (hb_comm_usable(self) != 0 ||
      hb_parse_run(self, args, nargs, &kind, &send, &recv, &op, &root) != 0)
    return NULL;
  if (hb_comm_lock(self) != 0) return NULL;
  coll_args_t a;
  hb_buf_t sb, rb;
  if (hb_prepare(self->state, coll_comm_size(self->comm), coll_comm_rank(self->comm), kind, send, recv, op,
                 root, &a, &sb, &rb) != 0) {
    hb_comm_unlock(self);
    return NULL;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_run(self->comm, &a);
  Py_END_ALLOW_THREADS
  hb_buf_release(&sb);
  hb_buf_release(&rb);
  PyObject *result = rc == 0 ? Py_NewRef(Py_None) : hb_comm_error(self, rc);
  hb_comm_unlock(self);
  return result;
}

static PyObject *comm_start(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  int kind, op, root;
  PyObject *send, *recv;
  if (hb_comm_usable(self) != 0 ||
      hb_parse_run(self, args, nargs, &kind, &send, &recv, &op, &root) != 0)
    return NULL;
  if (hb_comm_lock(self) != 0) return NULL;
  coll_args_t a;
  hb_buf_t sb, rb;
  PyObject *result = NULL;
  if (hb_prepare(self->state, coll_comm_size(self->comm), coll_comm_rank(self->comm), kind, send, recv, op,
                 root, &a, &sb, &rb) == 0) {
    coll_req_t *req = NULL;
    int rc = coll_start(self->comm, &a, &req);
    if (rc == 0) {
      result = hb_request_new(self, req, &sb, &rb); /* takes the buffers */
    } else {
      hb_buf_release(&sb);
      hb_buf_release(&rb);
      hb_comm_error(self, rc);
    }
  }
  hb_comm_unlock(self);
  return result;
}

PyObject *hb_comm_wrap(hb_state_t *st, coll_comm_t *c, PyObject *placement, int any_thread) {
  hb_comm_t *obj = (hb_comm_t *)st->CommType->tp_alloc(st->CommType, 0);
  if (obj == NULL) {
    coll_comm_free(c);
    return NULL;
  }
  hb_comm_lock_init(obj);
  obj->state = st;
  obj->owner_thread = PyThread_get_thread_ident();
  obj->any_thread = any_thread;
  obj->comm = c;
  obj->placement = Py_XNewRef(placement);
  return (PyObject *)obj;
}

static PyObject *comm_split(hb_comm_t *self, PyObject *args) {
  int color, key = 0;
  if (!PyArg_ParseTuple(args, "i|i", &color, &key)) return NULL;
  if (hb_comm_usable(self) != 0 || hb_comm_lock(self) != 0) return NULL;
  coll_comm_t *sub = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_comm_split(self->comm, color, key, &sub);
  Py_END_ALLOW_THREADS
  PyObject *result = NULL;
  if (rc != 0) {
    const char *text = NULL;
    if (sub) coll_comm_error(sub, &text);
    if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) {
      /* KeyboardInterrupt is already set */
    } else if (sub) {
      hb_raise(self->state, rc, text);
    } else {
      hb_comm_error(self, rc);
    }
    coll_comm_free(sub);
  } else if (sub == NULL) {
    result = Py_NewRef(Py_None);
  } else {
    result = hb_comm_wrap(self->state, sub, self->placement, self->any_thread);
  }
  hb_comm_unlock(self);
  return result;
}

static PyObject *comm_set_algorithm(hb_comm_t *self, PyObject *args) {
  int kind;
  const char *name;
  if (!PyArg_ParseTuple(args, "is", &kind, &name)) return NULL;
  if (hb_comm_lock(self) != 0) return NULL;
  int rc = coll_set_algorithm(self->comm, (coll_kind_t)kind, name);
  hb_comm_unlock(self);
  if (rc) return hb_bad_arg("unknown algorithm '%s' for this collective", name);
  Py_RETURN_NONE;
}

static PyObject *comm_close(hb_comm_t *self, PyObject *unused) {
  (void)unused;
  if (self->comm == NULL) Py_RETURN_NONE;
  if (hb_comm_lock(self) != 0) return NULL;
  if (hb_p2p_drain(self) != 0) { /* another thread's send/recv: wait for it */
    hb_comm_unlock(self);
    return NULL;
  }
  coll_comm_t *c = self->comm;
  int rc;
  char text[320];
  Py_BEGIN_ALLOW_THREADS
  rc = hb_settle(c, text, sizeof text); /* raised here rather than never */
  Py_END_ALLOW_THREADS
  self->comm = NULL;
  if (self->arena_live > 0) { /* hbmcoll.empty arrays still live: keep the mapping */
    if (coll__comm_here(c) != c) { /* across nodes: the rest goes now, with its goodbye */
      Py_BEGIN_ALLOW_THREADS
      c = coll__span_free_but_node(c);
      Py_END_ALLOW_THREADS
    }
    coll_comm_leave(c);
    self->kept = c;
  } else {
    Py_BEGIN_ALLOW_THREADS
    coll_comm_free(c);
    Py_END_ALLOW_THREADS
  }
  hb_comm_unlock(self);
  if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) return NULL; /* KeyboardInterrupt */
  if (rc) return hb_raise(self->state, rc, text[0] ? text : NULL);
  Py_RETURN_NONE;
}

static PyObject *comm_abort(hb_comm_t *self, PyObject *args) {
  int reason = COLL_EABORTED;
  if (!PyArg_ParseTuple(args, "|i", &reason)) return NULL;
  if (self->comm) coll_comm_abort(self->comm, reason);
  Py_RETURN_NONE;
}


static PyObject *comm_get_rank(hb_comm_t *self, void *c) {
  (void)c;
  return self->comm ? PyLong_FromLong(coll_comm_rank(self->comm)) : hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
}
static PyObject *comm_get_size(hb_comm_t *self, void *c) {
  (void)c;
  return self->comm ? PyLong_FromLong(coll_comm_size(self->comm)) : hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
}
/* Closed by close(), or failed for good (mismatch, lost peer, timeout, Ctrl-C, abort). */
static PyObject *comm_get_closed(hb_comm_t *self, void *c) {
  (void)c;
  return PyBool_FromLong(self->comm == NULL || coll_comm_error(self->comm, NULL) != 0);
}

static PyObject *comm_bind_thread(hb_comm_t *self, PyObject *unused) {
  (void)unused;
  self->owner_thread = PyThread_get_thread_ident();
  Py_RETURN_NONE;
}

static PyObject *comm_allow_any_thread(hb_comm_t *self, PyObject *unused) {
  (void)unused;
  self->any_thread = 1;
  Py_RETURN_NONE;
}
static PyObject *comm_get_single_copy(hb_comm_t *self, void *c) {
  (void)c;
  return PyLong_FromLong(self->comm ? coll_comm_single_copy(self->comm) : 0);
}
static PyObject *comm_get_staging(hb_comm_t *self, void *c) {
  (void)c;
  double t[2] = {0, 0};
  size_t from = self->comm ? coll_comm_stage_streaming(self->comm, t) : 0;
  return Py_BuildValue("(Kdd)", (unsigned long long)from, t[0], t[1]);
}
static PyObject *comm_get_single_copy_probe(hb_comm_t *self, void *c) {
  (void)c;
  double t[2] = {0, 0};
  size_t bytes = self->comm ? coll_comm_single_copy_probe(self->comm, t) : 0;
  return Py_BuildValue("(Kdd)", (unsigned long long)bytes, t[0], t[1]);
}
static PyObject *comm_get_algorithm(hb_comm_t *self, void *c) {
  (void)c;
  return PyUnicode_FromString(self->comm ? coll_comm_algorithm(self->comm) : "");
}
static PyObject *comm_get_error(hb_comm_t *self, void *c) {
  (void)c;
  if (self->comm == NULL) Py_RETURN_NONE;
  const char *text = NULL;
  int code = coll_comm_error(self->comm, &text);
  if (code == 0) Py_RETURN_NONE;
  return Py_BuildValue("(iss)", code, coll_err_name(code), text ? text : "");
}

static PyMethodDef comm_methods[] = {
    {"run", (PyCFunction)(void (*)(void))comm_run, METH_FASTCALL,
     "run(kind, send, recv, op, root): blocking collective"},
    {"start", (PyCFunction)(void (*)(void))comm_start, METH_FASTCALL,
     "start(kind, send, recv, op, root) -> Request"},
    {"prepare", (PyCFunction)(void (*)(void))hb_comm_prepare, METH_FASTCALL,
     "prepare(kind, send, recv, op, root) -> Prepared: the arguments read once; calling it runs "
     "the collective (the buffers must keep their memory)"},
    {"split", (PyCFunction)comm_split, METH_VARARGS, "split(color, key) -> Comm or None"},
    {"run_v", (PyCFunction)hb_comm_run_v, METH_VARARGS,
     "run_v(kind, send, recv, counts, op, root, make_out) -> the result make_out made, or None"},
    {"send", (PyCFunction)(void (*)(void))hb_comm_send, METH_FASTCALL, "send(buf, dest, tag): blocking send"},
    {"recv", (PyCFunction)(void (*)(void))hb_comm_recv, METH_FASTCALL,
     "recv(buf, source, tag) -> (source, tag, nbytes): blocking receive"},
    {"isend", (PyCFunction)(void (*)(void))hb_comm_isend, METH_FASTCALL, "isend(buf, dest, tag) -> P2PRequest"},
    {"irecv", (PyCFunction)(void (*)(void))hb_comm_irecv, METH_FASTCALL, "irecv(buf, source, tag) -> P2PRequest"},
    {"set_algorithm", (PyCFunction)comm_set_algorithm, METH_VARARGS, "force an algorithm"},
    {"arena_alloc", (PyCFunction)hb_comm_arena_alloc, METH_VARARGS, "arena_alloc(nbytes) -> ArenaBuffer"},
    {"close", (PyCFunction)comm_close, METH_NOARGS, "release the communicator"},
    {"abort", (PyCFunction)comm_abort, METH_VARARGS,
     "abort(reason=EABORTED): fail the communicator on every rank, with reason (a library code)"},
    {"bind_thread", (PyCFunction)comm_bind_thread, METH_NOARGS,
     "make the calling thread the one that issues collectives"},
    {"allow_any_thread", (PyCFunction)comm_allow_any_thread, METH_NOARGS,
     "let every thread issue collectives (the caller keeps their order the same on all ranks)"},
    {"span", (PyCFunction)hb_comm_span, METH_NOARGS,
     "span() -> (node, nodes, rings, node_of, local_of, bridge) across nodes, else None"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef comm_getset[] = {
    {"rank", (getter)comm_get_rank, NULL, NULL, NULL},
    {"size", (getter)comm_get_size, NULL, NULL, NULL},
    {"closed", (getter)comm_get_closed, NULL, NULL, NULL},
    {"single_copy", (getter)comm_get_single_copy, NULL,
     "bit (1 << kind) per collective (BCAST, GATHER) whose large messages copy straight "
     "between the ranks' own buffers; 0 none", NULL},
    {"staging", (getter)comm_get_staging, NULL,
     "(bytes, ordinary_s, streaming_s): staged chunks from this size are written with streaming "
     "stores (0 none), and the creation probe's best times (0: no probe)", NULL},
    {"single_copy_probe", (getter)comm_get_single_copy_probe, NULL,
     "(bytes, staged_s, single_s): the gathers the creation probe timed per rank (0: no probe) "
     "and its best batches", NULL},
    {"error", (getter)comm_get_error, NULL, "(code, name, text) after a failure, else None", NULL},
    {"algorithm", (getter)comm_get_algorithm, NULL, "what the last collective ran as ('' before one)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot comm_slots[] = {
    {Py_tp_new, comm_new},         {Py_tp_dealloc, comm_dealloc}, {Py_tp_traverse, comm_traverse},
    {Py_tp_methods, comm_methods}, {Py_tp_getset, comm_getset},   {0, NULL}};

static PyType_Spec comm_spec = {"hbmcoll._core.Comm", sizeof(hb_comm_t), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
                                comm_slots};

/* ---- module ----------------------------------------------------------------- */

static PyObject *hb_strerror(PyObject *m, PyObject *arg) {
  (void)m;
  int code = (int)PyLong_AsLong(arg);
  if (code == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(coll_strerror(code));
}

/* env_check() -> HBMCOLL_TIMEOUT's seconds or None; ArgumentError naming a malformed variable. */
static PyObject *hb_env_check(PyObject *m, PyObject *unused) {
  (void)unused;
  double timeout_s = 0;
  char text[320] = "";
  int rc = coll_env_check(&timeout_s, text, sizeof text);
  if (rc) return hb_raise(PyModule_GetState(m), rc, text);
  if (timeout_s > 0) return PyFloat_FromDouble(timeout_s);
  Py_RETURN_NONE;
}

static PyMethodDef hb_functions[] = {
    {"strerror", hb_strerror, METH_O, "text of a libcoll code"},
    {"env_check", hb_env_check, METH_NOARGS, "env_check() -> HBMCOLL_TIMEOUT seconds or None"},
    {"numa_report", (PyCFunction)(void (*)(void))hb_numa_report, METH_VARARGS | METH_KEYWORDS,
     "numa_report(topology=None, ranks=0, memory=None, bind=None, json=True, tree=False) -> str"},
    {"policy_words", hb_policy_words, METH_NOARGS, "policy_words() -> {'memory': (...), 'bind': (...)}"},
    {"variables", hb_variables, METH_NOARGS, "variables() -> ({'name', 'scope', 'meaning', 'default'}, ...)"},
    {"join_nodes", (PyCFunction)(void (*)(void))hb_join_nodes, METH_VARARGS | METH_KEYWORDS,
     "join_nodes(node, rank, size, name, secret, addr, ports, listener, iface, family, timeout, wait) -> Comm"},
    {"axpy", hb_axpy, METH_VARARGS, "axpy(y, x, alpha, dtype): y += alpha * x over raw bytes of dtype (a name), without the GIL"},
    {NULL, NULL, 0, NULL}};

static int hb_exec(PyObject *m) {
  hb_state_t *st = hb_state_of(m);
  /* 0 when the build had no NumPy headers (setup.py says so); tests check it is 1 */
  if (PyModule_AddIntConstant(m, "NUMPY_SHORTCUT", hb_np_init()) < 0) return -1;
  if (hb_errors_init(st, m) < 0) return -1;
  st->CommType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &comm_spec, NULL);
  st->RequestType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_request_spec, NULL);
  st->P2PRequestType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_p2p_request_spec, NULL);
  st->ArenaBufferType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_arena_spec, NULL);
  st->PlacementType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_placement_spec, NULL);
  st->BridgeType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_bridge_spec, NULL);
  st->PoolMemoryType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_pool_memory_spec, NULL);
  st->MemServeType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_memserve_spec, NULL);
  st->PreparedType = (PyTypeObject *)PyType_FromModuleAndSpec(m, &hb_prepared_spec, NULL);
  if (!st->CommType || !st->RequestType || !st->P2PRequestType || !st->ArenaBufferType || !st->PlacementType ||
      !st->BridgeType || !st->PoolMemoryType || !st->MemServeType || !st->PreparedType)
    return -1;
  if (PyModule_AddType(m, st->CommType) < 0 || PyModule_AddType(m, st->RequestType) < 0 ||
      PyModule_AddType(m, st->P2PRequestType) < 0 ||
      PyModule_AddType(m, st->ArenaBufferType) < 0 || PyModule_AddType(m, st->PlacementType) < 0 ||
      PyModule_AddType(m, st->BridgeType) < 0 || PyModule_AddType(m, st->PoolMemoryType) < 0 ||
      PyModule_AddType(m, st->MemServeType) < 0 || PyModule_AddType(m, st->PreparedType) < 0)
    return -1;
  static const char *kinds[] = {"BARRIER", "BCAST", "GATHER", "SCATTER", "ALLGATHER",
                                "REDUCE", "ALLREDUCE", "REDUCE_SCATTER", "ALLTOALL"};
  for (int k = 0; k < COLL_KIND_COUNT; k++)
    if (PyModule_AddIntConstant(m, kinds[k], k) < 0) return -1;
  static const char *ops[] = {"SUM", "PROD", "MIN", "MAX", "AVG"};
  for (int o = 0; o < COLL_OP_COUNT; o++)
    if (PyModule_AddIntConstant(m, ops[o], o) < 0) return -1;
  return 0;
}

static int hb_traverse(PyObject *m, visitproc visit, void *arg) {
  hb_state_t *st = hb_state_of(m);
  Py_VISIT(st->from_code);
  Py_VISIT(st->CommType);
  Py_VISIT(st->RequestType);
  Py_VISIT(st->P2PRequestType);
  Py_VISIT(st->ArenaBufferType);
  Py_VISIT(st->PlacementType);
  Py_VISIT(st->BridgeType);
  Py_VISIT(st->PoolMemoryType);
  Py_VISIT(st->MemServeType);
  Py_VISIT(st->PreparedType);
  return 0;
}

static int hb_clear(PyObject *m) {
  hb_state_t *st = hb_state_of(m);
  Py_CLEAR(st->from_code);
  Py_CLEAR(st->CommType);
  Py_CLEAR(st->RequestType);
  Py_CLEAR(st->P2PRequestType);
  Py_CLEAR(st->ArenaBufferType);
  Py_CLEAR(st->PlacementType);
  Py_CLEAR(st->BridgeType);
  Py_CLEAR(st->PoolMemoryType);
  Py_CLEAR(st->MemServeType);
  Py_CLEAR(st->PreparedType);
  return 0;
}

static void hb_free(void *m) { hb_clear(m); }
static PyModuleDef_Slot hb_slots[] = {{Py_mod_exec, hb_exec}, {0, NULL}};

static struct PyModuleDef hb_module = {PyModuleDef_HEAD_INIT, "hbmcoll._core",
                                       "C core of hbmcoll: shared-memory collectives.",
                                       sizeof(hb_state_t), hb_functions, hb_slots,
                                       hb_traverse, hb_clear, hb_free};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&hb_module); }
