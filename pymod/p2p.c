/*
 * p2p.c - hbmcoll._core's point-to-point: Comm.send/recv/isend/irecv over libcoll's
 * coll_send/coll_recv/coll_isend/coll_irecv (shared memory between the ranks of a node), and
 * P2PRequest, the request an isend or irecv returns.
 *
 * As for the collectives: arguments are checked and the buffer is taken with the GIL held
 * (hb_buf_get_bytes: any element type), and the call runs with the GIL released. Unlike the
 * collectives, point-to-point calls do not take the communicator's lock: libcoll's p2p layer
 * has its own, held only for short steps, so a thread blocked in recv does not hold up a
 * send from another (a helper thread receiving, as torch-style code and MPI programs do).
 * A count of the calls in flight (p2p_users) keeps the communicator alive under them: close()
 * refuses new ones and waits for those in flight (Ctrl-C ends that wait). A blocking call's
 * waits run hb_interrupt (the communicator's interrupt callback), so Ctrl-C ends them with
 * KeyboardInterrupt: the message is withdrawn. So does dropping an unfinished request (its
 * buffer goes with it): libcoll waits for it, Ctrl-C withdraws it, and the KeyboardInterrupt
 * is raised again at the next chance (a deallocator cannot raise). A request's wait() sleeps in 50 ms slices
 * without the GIL and runs signal handlers between them; when its time runs out a receive
 * nothing matched yet is withdrawn (TimeoutError), one being filled is waited out.
 * Errors of one call (a message longer than the buffer, a timeout) leave the communicator
 * usable; a dead peer fails it, as in the collectives.
 */
#include "core.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <time.h>

typedef struct {
  PyObject_HEAD
  hb_comm_t *comm;
  coll_req_t *req;
  hb_buf_t buf;
  int recv, peer, tag;
  size_t cap;
  int finished, result;
  coll_status_t status;
} hb_p2p_request_t;

static int p2p_int(PyObject *o, const char *what, long *v) {
  if (!PyLong_CheckExact(o) && (!PyLong_Check(o) || PyBool_Check(o))) {
    PyErr_Format(PyExc_TypeError, "%s must be an int", what);
    return -1;
  }
  int overflow = 0;
  *v = PyLong_AsLongAndOverflow(o, &overflow);
  if (overflow) *v = overflow > 0 ? LONG_MAX : LONG_MIN;
  return *v == -1 && PyErr_Occurred() ? -1 : 0;
}

/* (buf, peer, tag): the ranks and tag checked; the buffer is taken last. */
static int p2p_args(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs, int recv, int *peer, int *tag) {
  const char *call = recv ? "recv" : "send";
  if (nargs != 3) {
    PyErr_Format(PyExc_TypeError, "%s takes (buf, %s, tag)", call, recv ? "source" : "dest");
    return -1;
  }
  if (self->comm == NULL) {
    hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
    return -1;
  }
  long p, t;
  const char *who = recv ? "source" : "dest";
  if (p2p_int(args[1], who, &p) || p2p_int(args[2], "tag", &t)) return -1;
  int size = coll_comm_size(self->comm);
  if (!((p >= 0 && p < size) || (recv && p == COLL_ANY_SOURCE))) {
    hb_bad_arg("%s %ld is not a rank of this communicator (size %d)", who, p, size);
    return -1;
  }
  if (!((t >= 0 && t <= INT_MAX) || (recv && t == COLL_ANY_TAG))) {
    hb_bad_arg("tag %ld: an int from 0 to %d%s", t, INT_MAX, recv ? ", or ANY_TAG" : "");
    return -1;
  }
  *peer = (int)p;
  *tag = (int)t;
  return 0;
}

static void p2p_who(int source, char *out, size_t len) {
  if (source == COLL_ANY_SOURCE) snprintf(out, len, "any rank");
  else snprintf(out, len, "rank %d", source);
}

/* The exception of a point-to-point result (NULL), with the words of the socket path. */
static PyObject *p2p_raise(hb_comm_t *self, int rc, int recv, int peer, int tag, size_t cap,
                           const coll_status_t *st, double waited) {
  char text[256], who[32];
  if (rc == COLL_EMISMATCH && recv) {
    snprintf(text, sizeof text, "recv: the message from rank %d (tag %d) has %zu bytes; the buffer holds %zu",
             st->source, st->tag, st->bytes, cap);
    return hb_raise(self->state, rc, text);
  }
  if (rc == -ETIMEDOUT) {
    p2p_who(peer, who, sizeof who);
    if (recv)
      snprintf(text, sizeof text, "recv: no message from %s (tag %d) in %g s", who, tag, waited);
    else
      snprintf(text, sizeof text, "send: rank %d took no message in %g s", peer, waited);
    return hb_raise(self->state, rc, text);
  }
  if (self->comm == NULL) return hb_raise(self->state, rc, NULL);
  return hb_comm_raise(self, rc);
}

/* With the GIL: count this call in, unless the communicator is closed or closing. */
static int p2p_enter(hb_comm_t *self) {
  if (self->comm == NULL || self->p2p_closing) {
    hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
    return -1;
  }
  atomic_fetch_add(&self->p2p_users, 1);
  return 0;
}

static void p2p_leave(hb_comm_t *self) {
  if (atomic_fetch_sub(&self->p2p_users, 1) != 1 || !self->p2p_closing) return;
  pthread_mutex_lock(&self->wait_mu);
  pthread_cond_broadcast(&self->wait_cv);
  pthread_mutex_unlock(&self->wait_mu);
}

int hb_p2p_drain(hb_comm_t *self) {
  self->p2p_closing = 1;
  while (atomic_load(&self->p2p_users) > 0) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->wait_mu);
    if (atomic_load(&self->p2p_users) > 0) {
      struct timespec until;
      clock_gettime(CLOCK_MONOTONIC, &until); /* wait_cv runs on CLOCK_MONOTONIC (comm_lock.c) */
      until.tv_nsec += 200 * 1000000L;
      if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
      pthread_cond_timedwait(&self->wait_cv, &self->wait_mu, &until);
    }
    pthread_mutex_unlock(&self->wait_mu);
    Py_END_ALLOW_THREADS
    if (PyErr_CheckSignals() < 0) {
      self->p2p_closing = 0;
      return -1;
    }
  }
  return 0;
}

static double p2p_comm_timeout(void) {
  double t = 0;
  coll_env_check(&t, NULL, 0);
  return t;
}

static PyObject *p2p_blocking(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs, int recv) {
  int peer, tag;
  if (p2p_args(self, args, nargs, recv, &peer, &tag) != 0) return NULL;
  if (p2p_enter(self) != 0) return NULL;
  hb_buf_t b;
  if (hb_buf_get_bytes(args[0], recv, "send/recv", &b) != 0) {
    p2p_leave(self);
    return NULL;
  }
  coll_status_t st = {0, 0, 0};
  int rc;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  Py_BEGIN_ALLOW_THREADS
  rc = recv ? coll_recv(self->comm, b.ptr, b.nbytes, peer, tag, &st) : coll_send(self->comm, b.ptr, b.nbytes, peer, tag);
  Py_END_ALLOW_THREADS
  clock_gettime(CLOCK_MONOTONIC, &t1);
  size_t cap = b.nbytes;
  hb_buf_release(&b);
  PyObject *result;
  if (rc == 0) result = recv ? Py_BuildValue("(iin)", st.source, st.tag, (Py_ssize_t)st.bytes) : Py_NewRef(Py_None);
  else if (rc == COLL_EINTERRUPTED && PyErr_Occurred()) result = NULL; /* KeyboardInterrupt */
  else {
    double waited = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (rc == -ETIMEDOUT) waited = p2p_comm_timeout();
    result = p2p_raise(self, rc, recv, peer, tag, cap, &st, waited);
  }
  p2p_leave(self);
  return result;
}

PyObject *hb_comm_send(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  return p2p_blocking(self, args, nargs, 0);
}

PyObject *hb_comm_recv(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  return p2p_blocking(self, args, nargs, 1);
}

static PyObject *p2p_start(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs, int recv) {
  int peer, tag;
  if (p2p_args(self, args, nargs, recv, &peer, &tag) != 0) return NULL;
  PyTypeObject *tp = self->state->P2PRequestType;
  hb_p2p_request_t *r = (hb_p2p_request_t *)tp->tp_alloc(tp, 0);
  if (r == NULL) return NULL;
  if (p2p_enter(self) != 0) {
    Py_DECREF(r);
    return NULL;
  }
  if (hb_buf_get_bytes(args[0], recv, "send/recv", &r->buf) != 0) {
    p2p_leave(self);
    Py_DECREF(r);
    return NULL;
  }
  r->recv = recv;
  r->peer = peer;
  r->tag = tag;
  r->cap = r->buf.nbytes;
  int rc = recv ? coll_irecv(self->comm, r->buf.ptr, r->buf.nbytes, peer, tag, &r->req)
                : coll_isend(self->comm, r->buf.ptr, r->buf.nbytes, peer, tag, &r->req);
  if (rc == 0) r->comm = (hb_comm_t *)Py_NewRef(self);
  p2p_leave(self);
  if (rc != 0) {
    r->req = NULL;
    Py_DECREF(r);
    return p2p_raise(self, rc, recv, peer, tag, 0, NULL, 0);
  }
  return (PyObject *)r;
}

PyObject *hb_comm_isend(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  return p2p_start(self, args, nargs, 0);
}

PyObject *hb_comm_irecv(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  return p2p_start(self, args, nargs, 1);
}

/* ---- P2PRequest ----------------------------------------------------------- */

static void p2p_finish(hb_p2p_request_t *r, int result) {
  if (r->finished) return;
  r->finished = 1;
  r->result = result;
  if (r->recv) coll_req_status(r->req, &r->status);
  hb_buf_release(&r->buf);
}

static double p2p_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *p2p_result(hb_p2p_request_t *r) {
  if (r->result == 0 || (r->result == COLL_EMISMATCH && !r->recv))
    return r->recv ? Py_BuildValue("(iin)", r->status.source, r->status.tag, (Py_ssize_t)r->status.bytes)
                   : Py_NewRef(Py_None);
  if (r->result == -ECANCELED)
    return hb_raise(r->comm->state, COLL_EABORTED, "recv: the receive was withdrawn");
  return p2p_raise(r->comm, r->result, r->recv, r->peer, r->tag, r->cap, &r->status, 0);
}

/* wait(timeout=None): the result ((source, tag, nbytes) for a receive, None for a send) once
 * done; TimeoutError after timeout seconds (a receive nothing matched is then withdrawn; a
 * send goes on). */
static PyObject *p2p_wait(hb_p2p_request_t *r, PyObject *args, PyObject *kw) {
  static char *names[] = {"timeout", NULL};
  PyObject *tobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O", names, &tobj)) return NULL;
  double timeout = -1;
  if (tobj != Py_None && (timeout = PyFloat_AsDouble(tobj)) < 0) {
    if (!PyErr_Occurred()) hb_bad_arg("timeout must be >= 0");
    return NULL;
  }
  double deadline = p2p_now() + timeout;
  while (!r->finished) {
    double slice = 0.05;
    if (timeout >= 0 && deadline - p2p_now() < slice) slice = deadline - p2p_now();
    if (slice < 0) slice = 0;
    int rc, fin, result = 0, cancelled = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = coll_req_wait(r->req, slice);
    fin = coll_req_test(r->req, &result);
    Py_END_ALLOW_THREADS
    if (fin) {
      p2p_finish(r, result);
      break;
    }
    if (rc != -ETIMEDOUT) { /* the communicator failed: the request is over with it */
      p2p_finish(r, rc);
      break;
    }
    if (PyErr_CheckSignals() < 0) return NULL;
    if (timeout >= 0 && p2p_now() >= deadline) {
      if (r->recv) {
        cancelled = coll_req_cancel(r->req) == 0;
        if (!cancelled) { /* a message is being taken into it: see it through */
          timeout = -1;
          continue;
        }
        p2p_finish(r, -ECANCELED);
      }
      return p2p_raise(r->comm, -ETIMEDOUT, r->recv, r->peer, r->tag, r->cap, NULL, timeout);
    }
  }
  return p2p_result(r);
}

static PyObject *p2p_test(hb_p2p_request_t *r, PyObject *unused) {
  (void)unused;
  if (!r->finished) {
    int result = 0, fin;
    Py_BEGIN_ALLOW_THREADS
    fin = coll_req_test(r->req, &result);
    Py_END_ALLOW_THREADS
    if (!fin) Py_RETURN_FALSE;
    p2p_finish(r, result);
  }
  Py_RETURN_TRUE;
}

static PyObject *p2p_done(hb_p2p_request_t *r, void *c) {
  (void)c;
  return p2p_test(r, NULL);
}

/* cancel(): True when a receive nothing matched yet was withdrawn (nothing will land in its
 * buffer; wait() then raises), False otherwise. */
static PyObject *p2p_cancel(hb_p2p_request_t *r, PyObject *unused) {
  (void)unused;
  if (r->finished || !r->recv || coll_req_cancel(r->req) != 0) Py_RETURN_FALSE;
  p2p_finish(r, -ECANCELED);
  Py_RETURN_TRUE;
}

static void p2p_dealloc(hb_p2p_request_t *r) {
  PyTypeObject *tp = Py_TYPE(r);
  PyObject_GC_UnTrack(r);
  if (r->req) {
    coll_req_t *req = r->req;
    r->req = NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* a deallocator keeps what is being raised */
    Py_BEGIN_ALLOW_THREADS
    coll_req_free(req); /* withdraws a receive nothing matched; else waits (Ctrl-C ends it) */
    Py_END_ALLOW_THREADS
    if (PyErr_Occurred()) { /* hb_interrupt ended the wait: raise it where Python can */
      if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        PyErr_Clear();
        PyErr_SetInterrupt();
      } else {
        PyErr_WriteUnraisable(NULL);
      }
    }
    PyErr_Restore(type, value, tb);
  }
  hb_buf_release(&r->buf);
  Py_CLEAR(r->comm);
  tp->tp_free(r);
  Py_DECREF(tp);
}

static int p2p_traverse(hb_p2p_request_t *r, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(r));
  Py_VISIT(r->comm);
  return 0;
}

static PyMethodDef p2p_methods[] = {
    {"wait", (PyCFunction)(void (*)(void))p2p_wait, METH_VARARGS | METH_KEYWORDS,
     "wait(timeout=None) -> (source, tag, nbytes) for a receive, None for a send"},
    {"test", (PyCFunction)p2p_test, METH_NOARGS, "True when done"},
    {"cancel", (PyCFunction)p2p_cancel, METH_NOARGS, "withdraw a receive nothing matched yet: True if it was"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef p2p_getset[] = {{"done", (getter)p2p_done, NULL, NULL, NULL}, {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot p2p_slots[] = {{Py_tp_dealloc, p2p_dealloc},
                                  {Py_tp_traverse, p2p_traverse},
                                  {Py_tp_methods, p2p_methods},
                                  {Py_tp_getset, p2p_getset},
                                  {0, NULL}};

PyType_Spec hb_p2p_request_spec = {"hbmcoll._core.P2PRequest", sizeof(hb_p2p_request_t), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
                                   p2p_slots};
