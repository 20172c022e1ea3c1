/*
 * pool_memory.c - hbmcoll._core.PoolMemory(placement, nbytes): a memory server's pool, placed
 * by the placement's plan (HBM through memkind, or mbind, where the node has it; DDR else),
 * zeroed, exported with the buffer protocol for the bridge to register. `node` says where its
 * pages landed. Keeps its Placement alive: the memory goes back through the same context.
 */
#include "core.h"

#include "coll_numa.h"

typedef struct {
  PyObject_HEAD
  PyObject *placement; /* keeps the numa context alive */
  void *ptr;
  Py_ssize_t nbytes;
  int node;
} hb_pool_memory_t;

static PyObject *pool_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"placement", "nbytes", NULL};
  PyObject *placement;
  Py_ssize_t nbytes;
  hb_state_t *st = PyType_GetModuleState(type);
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!n", names, st->PlacementType, &placement, &nbytes)) return NULL;
  if (nbytes < 1) return hb_bad_arg("a pool of %zd bytes: give at least 1", nbytes);
  void *ptr = NULL;
  int node = -1, rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_numa_pool_alloc(hb_placement_ctx(placement), (size_t)nbytes, &ptr, &node);
  Py_END_ALLOW_THREADS
  if (rc) return PyErr_Format(PyExc_MemoryError, "a pool of %zd bytes could not be allocated: %s", nbytes,
                              coll_strerror(rc));
  hb_pool_memory_t *self = (hb_pool_memory_t *)type->tp_alloc(type, 0);
  if (self == NULL) {
    coll_numa_scratch_free(hb_placement_ctx(placement), ptr, (size_t)nbytes);
    return NULL;
  }
  self->placement = Py_NewRef(placement);
  self->ptr = ptr, self->nbytes = nbytes, self->node = node;
  return (PyObject *)self;
}

static int pool_getbuffer(hb_pool_memory_t *self, Py_buffer *view, int flags) {
  return PyBuffer_FillInfo(view, (PyObject *)self, self->ptr, self->nbytes, 0, flags);
}

static void pool_dealloc(hb_pool_memory_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  if (self->placement) coll_numa_scratch_free(hb_placement_ctx(self->placement), self->ptr, (size_t)self->nbytes);
  Py_CLEAR(self->placement);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static int pool_traverse(hb_pool_memory_t *self, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(self->placement);
  return 0;
}

static PyObject *pool_node(hb_pool_memory_t *self, void *c) {
  (void)c;
  return PyLong_FromLong(self->node);
}

static PyGetSetDef pool_getset[] = {
    {"node", (getter)pool_node, NULL, "the NUMA node most of the pool's pages sit on (-1: unknown)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot pool_slots[] = {{Py_tp_new, pool_new},
                                   {Py_bf_getbuffer, pool_getbuffer},
                                   {Py_tp_dealloc, pool_dealloc},
                                   {Py_tp_traverse, pool_traverse},
                                   {Py_tp_getset, pool_getset},
                                   {0, NULL}};

PyType_Spec hb_pool_memory_spec = {"hbmcoll._core.PoolMemory", sizeof(hb_pool_memory_t), 0,
                                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, pool_slots};
