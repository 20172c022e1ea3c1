/*
 * request.c - hbmcoll._core.Request: a nonblocking collective in flight.
 * It owns the buffers until the collective finishes (several threads may wait
 * on it at once); wait() sleeps in short
 * slices with the GIL released and runs signal handlers between them, so
 * Ctrl-C interrupts the wait (the collective itself goes on).
 */
#include "core.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

typedef struct {
  PyObject_HEAD
  hb_comm_t *comm;
  coll_req_t *req;
  hb_buf_t sb, rb;
  int finished, result;
} hb_request_t;

PyObject *hb_request_new(hb_comm_t *comm, coll_req_t *req, hb_buf_t *sb, hb_buf_t *rb) {
  PyTypeObject *tp = comm->state->RequestType;
  hb_request_t *r = (hb_request_t *)tp->tp_alloc(tp, 0);
  if (r == NULL) {
    Py_BEGIN_ALLOW_THREADS
    coll_req_free(req); /* waits: the buffers are in use */
    Py_END_ALLOW_THREADS
    hb_buf_release(sb);
    hb_buf_release(rb);
    return NULL;
  }
  r->comm = (hb_comm_t *)Py_NewRef(comm);
  r->req = req;
  r->sb = *sb;
  r->rb = *rb;
  return (PyObject *)r;
}

/* The collective is over: keep its result and let the buffers go. The C
 * request itself lives until dealloc, because another Python thread may
 * still be inside coll_req_wait() on it with the GIL released. */
static void request_finish(hb_request_t *r, int result) {
  if (r->finished) return;
  r->finished = 1;
  r->result = result;
  hb_buf_release(&r->sb);
  hb_buf_release(&r->rb);
}

static PyObject *request_result(hb_request_t *r) {
  if (r->result == 0) Py_RETURN_NONE;
  const char *text = NULL;
  int code = r->comm->comm ? coll_comm_error(r->comm->comm, &text) : 0;
  /* code 0: across nodes, the communicator goes on after a disagreement, with its sentence */
  int kept = code == 0 && (r->result == COLL_EMISMATCH || r->result == COLL_EBADARG) && text && *text;
  return hb_raise(r->comm->state, r->result, code == r->result || kept ? text : NULL);
}

static double request_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -1 with Error set when this is a fork()ed child's copy of the parent's request. */
static int request_forked(hb_request_t *r) {
  coll_comm_t *c = r->comm->comm ? r->comm->comm : r->comm->kept;
  if (r->finished || c == NULL || !coll_comm_forked(c)) return 0;
  hb_raise(r->comm->state, COLL_EFORKED,
           "this request was started by the parent process; a fork()ed child cannot wait for it");
  return -1;
}

static PyObject *request_wait(hb_request_t *r, PyObject *args, PyObject *kw) {
  static char *names[] = {"timeout", NULL};
  if (request_forked(r)) return NULL;
  PyObject *tobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", names, &tobj)) return NULL;
  double timeout = -1;
  if (tobj != Py_None && (timeout = PyFloat_AsDouble(tobj)) < 0) {
    if (!PyErr_Occurred()) hb_bad_arg("timeout must be >= 0");
    return NULL;
  }
  double deadline = request_now() + timeout;
  while (!r->finished) {
    double slice = 0.05;
    if (timeout >= 0 && deadline - request_now() < slice) slice = deadline - request_now();
    if (slice < 0) slice = 0;
    int rc, fin, result = 0;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_req_wait(r->req, slice);
    fin = coll_req_test(r->req, &result);
    Py_END_ALLOW_THREADS
    (void)rc;
    if (fin) {
      request_finish(r, result);
      break;
    }
    if (PyErr_CheckSignals() < 0) return NULL;
    if (timeout >= 0 && request_now() >= deadline) {
      char text[96];
      snprintf(text, sizeof text, "the request did not complete within %g s", timeout);
      return hb_raise(r->comm->state, -ETIMEDOUT, text);
    }
  }
  return request_result(r);
}

static PyObject *request_test(hb_request_t *r, PyObject *unused) {
  (void)unused;
  if (request_forked(r)) return NULL;
  if (!r->finished) {
    int result = 0;
    if (!coll_req_test(r->req, &result)) Py_RETURN_FALSE;
    request_finish(r, result);
  }
  PyObject *res = request_result(r);
  if (res == NULL) return NULL;
  Py_DECREF(res);
  Py_RETURN_TRUE;
}

static PyObject *request_done(hb_request_t *r, void *c) {
  (void)c;
  if (!r->finished) {
    int result = 0;
    if (coll_req_test(r->req, &result)) request_finish(r, result);
  }
  return PyBool_FromLong(r->finished);
}

/* Ctrl-C caught while a dropped request drained, raised again once the deallocator returned.
 * A pending call raises it at the next bytecode that checks; a blocking C call that comes
 * first (time.sleep) checks only when a signal interrupts it, so a helper thread sends SIGINT
 * to the thread after REDELIVER_S if the pending call has not run by then. Whichever comes
 * first wins (state 0 -> 1), so the KeyboardInterrupt comes once. */
#define REDELIVER_S 0.05
typedef struct {
  atomic_int state, refs;
  pthread_t thread;
  PyObject *exc[3]; /* the handler's exception (the pending call's to raise or drop) */
} request_redeliver_t;

static void redeliver_put(request_redeliver_t *d) {
  if (atomic_fetch_sub(&d->refs, 1) == 1) free(d);
}

static int redeliver_call(void *arg) {
  request_redeliver_t *d = arg;
  int mine = 0;
  int raise = d->exc[0] != NULL && atomic_compare_exchange_strong(&d->state, &mine, 1);
  if (raise) {
    PyErr_Restore(d->exc[0], d->exc[1], d->exc[2]);
  } else {
    Py_XDECREF(d->exc[0]);
    Py_XDECREF(d->exc[1]);
    Py_XDECREF(d->exc[2]);
  }
  redeliver_put(d);
  return raise ? -1 : 0;
}

static void *redeliver_thread(void *arg) {
  request_redeliver_t *d = arg;
  struct timespec ts = {0, (long)(REDELIVER_S * 1e9)};
  nanosleep(&ts, NULL);
  int mine = 0;
  if (atomic_compare_exchange_strong(&d->state, &mine, 1)) pthread_kill(d->thread, SIGINT);
  redeliver_put(d);
  return NULL;
}

static void request_redeliver(PyObject *exc[3]) {
  request_redeliver_t *d = calloc(1, sizeof *d);
  pthread_t t;
  pthread_attr_t attr;
  if (d == NULL) {
    PyErr_Restore(exc[0], exc[1], exc[2]);
    PyErr_Clear();
    PyErr_SetInterrupt(); /* the next check, at least */
    return;
  }
  atomic_init(&d->state, 0);
  atomic_init(&d->refs, 2);
  d->thread = pthread_self();
  if (Py_AddPendingCall(redeliver_call, d) == 0) {
    memcpy(d->exc, exc, sizeof d->exc);
  } else { /* queue full: the thread alone */
    PyErr_Restore(exc[0], exc[1], exc[2]);
    PyErr_Clear();
    atomic_store(&d->refs, 1);
  }
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  if (pthread_create(&t, &attr, redeliver_thread, d) != 0) {
    int mine = 0;
    if (atomic_compare_exchange_strong(&d->state, &mine, 1)) PyErr_SetInterrupt();
    redeliver_put(d);
  }
  pthread_attr_destroy(&attr);
}

/* A request dropped while its collective runs: wait for it (peers may still
 * use the buffers), in slices, running signal handlers between them. Ctrl-C
 * fails the communicator on every rank, which ends the collective at once;
 * the KeyboardInterrupt is raised again right after (request_redeliver), since
 * a deallocator cannot raise. An exception already in flight is kept. */
static void request_drain(hb_request_t *r) {
  PyObject *type, *value, *tb, *interrupt[3] = {NULL, NULL, NULL};
  PyErr_Fetch(&type, &value, &tb);
  int interrupted = 0, fin = 0;
  while (!fin) {
    Py_BEGIN_ALLOW_THREADS
    coll_req_wait(r->req, 0.05);
    fin = coll_req_test(r->req, NULL);
    Py_END_ALLOW_THREADS
    if (fin || interrupted || PyErr_CheckSignals() == 0) continue;
    interrupted = 1;
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) PyErr_Fetch(&interrupt[0], &interrupt[1], &interrupt[2]);
    else PyErr_WriteUnraisable((PyObject *)r); /* another handler's error: shown, not lost */
    if (r->comm->comm) coll_comm_abort(r->comm->comm, COLL_EPEERLOST);
  }
  PyErr_Restore(type, value, tb);
  if (interrupt[0]) request_redeliver(interrupt);
}

static void request_dealloc(hb_request_t *r) {
  PyTypeObject *tp = Py_TYPE(r);
  PyObject_GC_UnTrack(r);
  coll_comm_t *c = r->comm->comm ? r->comm->comm : r->comm->kept;
  if (r->req && c && coll_comm_forked(c)) /* the parent's request: its thread is not here */
    r->req = NULL;
  if (r->req) {
    if (!coll_req_test(r->req, NULL)) request_drain(r);
    coll_req_free(r->req); /* finished: does not wait */
    r->req = NULL;
  }
  hb_buf_release(&r->sb);
  hb_buf_release(&r->rb);
  Py_CLEAR(r->comm);
  tp->tp_free(r);
  Py_DECREF(tp);
}

static int request_traverse(hb_request_t *r, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(r));
  Py_VISIT(r->comm);
  return 0;
}

static PyMethodDef request_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))request_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None): block until done; raises the collective's error"},
    {"test", (PyCFunction)request_test, METH_NOARGS, "True when done (raises its error)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef request_getset[] = {{"done", (getter)request_done, NULL, NULL, NULL},
                                       {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot request_slots[] = {{Py_tp_dealloc, request_dealloc},
                                      {Py_tp_traverse, request_traverse},
                                      {Py_tp_methods, request_methods},
                                      {Py_tp_getset, request_getset},
                                      {0, NULL}};

PyType_Spec hb_request_spec = {"hbmcoll._core.Request", sizeof(hb_request_t), 0,
                               Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
                               request_slots};
