/*
 * arena_buffer.c - hbmcoll._core.ArenaBuffer: bytes inside a communicator's
 * shared arena (what hbmcoll.empty() wraps in a NumPy array), exported with
 * the buffer protocol. Each keeps its communicator object alive; a closed
 * communicator keeps its mapping until the last of its buffers goes.
 */
#include "core.h"

#include <errno.h>

/* ---- ArenaBuffer: bytes inside the shared arena, exported as a buffer ---- */

typedef struct {
  PyObject_HEAD
  hb_comm_t *owner; /* keeps the mapping alive */
  void *ptr;
  Py_ssize_t nbytes;
} hb_arena_buf_t;

PyObject *hb_comm_arena_alloc(hb_comm_t *self, PyObject *args) {
  Py_ssize_t nbytes;
  if (!PyArg_ParseTuple(args, "n", &nbytes)) return NULL;
  if (nbytes < 0) return hb_bad_arg("negative size");
  if (self->comm == NULL) return hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
  const char *failed = NULL;
  int code = coll_comm_error(self->comm, &failed);
  if (code != 0) return hb_raise(self->state, code, failed);
  void *ptr;
  int rc = coll_arena_alloc(self->comm, (size_t)nbytes, 64, &ptr);
  if (rc == -ENOMEM)
    return PyErr_Format(PyExc_MemoryError,
                        "the shared arena has no room for %zd bytes (HBMCOLL_ARENA_BYTES sets its size per rank)",
                        nbytes);
  if (rc) return hb_raise(self->state, rc, NULL);
  PyTypeObject *tp = self->state->ArenaBufferType;
  hb_arena_buf_t *b = (hb_arena_buf_t *)tp->tp_alloc(tp, 0);
  if (b == NULL) {
    coll_arena_free(self->comm, ptr);
    return NULL;
  }
  b->owner = (hb_comm_t *)Py_NewRef(self);
  self->arena_live++;
  b->ptr = ptr;
  b->nbytes = nbytes;
  return (PyObject *)b;
}

static int arena_getbuffer(hb_arena_buf_t *self, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->nbytes, 0, flags);
}

static void arena_dealloc(hb_arena_buf_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  hb_comm_t *o = self->owner;
  if (o) {
    coll_arena_free(o->comm ? o->comm : o->kept, self->ptr);
    if (--o->arena_live == 0 && o->kept) { /* the last array of a closed communicator */
      coll_comm_free(o->kept);
      o->kept = NULL;
    }
  }
  Py_CLEAR(self->owner);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static int arena_traverse(hb_arena_buf_t *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->owner);
  return 0;
}

static PyType_Slot arena_slots[] = {{Py_bf_getbuffer, arena_getbuffer},
                                    {Py_tp_dealloc, arena_dealloc},
                                    {Py_tp_traverse, arena_traverse},
                                    {0, NULL}};

PyType_Spec hb_arena_spec = {"hbmcoll._core.ArenaBuffer", sizeof(hb_arena_buf_t), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE,
                                 arena_slots};

