/*
 * prepared.c - hbmcoll._core.Prepared: one collective's arguments read once, run many times
 * (as MPI-4's persistent collectives, MPI_Allreduce_init).
 *
 * Why. Reading a torch tensor's address, size and dtype costs seven calls into torch
 * (torch_fast.c): a microsecond each when hot, several times that when the call comes right
 * after a backward pass has taken the caches, as DDP's comm hook does (bench/README.md). A
 * Prepared reads them at Comm.prepare() and holds the buffers from then on, so each call is
 * the lock, the collective without the GIL, and the unlock.
 *
 * The contract is MPI's: the buffers keep their memory between the calls. Holding them keeps
 * them alive, not in place: a torch tensor's resize_ or set_, or a NumPy resize(refcheck=False),
 * would leave this pointing at freed memory. So it is not public: only callers that own the
 * storage (the DDP hook, torch/ddp.py) prepare.
 */
#include "core.h"

#include <string.h>

typedef struct {
  PyObject_HEAD
  hb_comm_t *comm;
  coll_args_t args;
  hb_buf_t sb, rb;
} hb_prepared_t;

PyObject *hb_comm_prepare(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs) {
  int kind, op, root;
  PyObject *send, *recv;
  if (hb_comm_usable(self) != 0 ||
      hb_parse_run(self, args, nargs, &kind, &send, &recv, &op, &root) != 0)
    return NULL;
  if (self->comm == NULL) return hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
  PyTypeObject *tp = self->state->PreparedType;
  hb_prepared_t *p = (hb_prepared_t *)tp->tp_alloc(tp, 0);
  if (p == NULL) return NULL;
  if (hb_prepare(self->state, coll_comm_size(self->comm), coll_comm_rank(self->comm), kind, send,
                 recv, op, root, &p->args, &p->sb, &p->rb) != 0) {
    Py_DECREF(p);
    return NULL;
  }
  p->comm = (hb_comm_t *)Py_NewRef(self);
  return (PyObject *)p;
}

static int buf_traverse(const hb_buf_t *b, visitproc visit, void *arg) {
  Py_VISIT(b->owner);
  Py_VISIT(b->capsule);
  if (b->has_view) Py_VISIT(b->view.obj);
  return 0;
}

/* A Prepared is kept, so the cycles through its buffers are the collector's to find (a
 * tensor holding its own prepared call in its __dict__) */
static int prepared_traverse(hb_prepared_t *p, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(p));
  Py_VISIT(p->comm);
  int rc = buf_traverse(&p->sb, visit, arg);
  return rc ? rc : buf_traverse(&p->rb, visit, arg);
}

static int prepared_clear(hb_prepared_t *p) {
  hb_buf_release(&p->sb);
  hb_buf_release(&p->rb);
  memset(&p->args, 0, sizeof p->args);
  Py_CLEAR(p->comm);
  return 0;
}

/* p(): run the collective; None, or the error comm.run would raise. */
static PyObject *prepared_call(hb_prepared_t *p, PyObject *args, PyObject *kw) {
  if (PyTuple_GET_SIZE(args) != 0 || (kw && PyDict_GET_SIZE(kw) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a prepared collective takes no arguments");
    return NULL;
  }
  hb_comm_t *c = p->comm;
  if (c == NULL) { /* cleared by the collector: only a finalizer can still call it */
    PyErr_SetString(PyExc_RuntimeError, "this prepared collective was cleared");
    return NULL;
  }
  if (hb_comm_usable(c) != 0 || hb_comm_lock(c) != 0) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_run(c->comm, &p->args);
  Py_END_ALLOW_THREADS
  PyObject *result = rc == 0 ? Py_NewRef(Py_None) : hb_comm_raise(c, rc);
  hb_comm_unlock(c);
  return result;
}

static void prepared_dealloc(hb_prepared_t *p) {
  PyTypeObject *tp = Py_TYPE(p);
  PyObject_GC_UnTrack(p);
  prepared_clear(p);
  tp->tp_free(p);
  Py_DECREF(tp);
}

static PyType_Slot prepared_slots[] = {{Py_tp_dealloc, prepared_dealloc},
                                       {Py_tp_traverse, prepared_traverse},
                                       {Py_tp_clear, prepared_clear},
                                       {Py_tp_call, prepared_call},
                                       {Py_tp_doc, "a collective prepared by Comm.prepare(); "
                                                   "calling it runs the collective"},
                                       {0, NULL}};

PyType_Spec hb_prepared_spec = {"hbmcoll._core.Prepared", sizeof(hb_prepared_t), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
                                prepared_slots};
