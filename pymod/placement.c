/*
 * placement.c - hbmcoll._core.Placement: this process's numa/ context (the
 * discovered topology, the plan, the pinning done at setup), and
 * report()/notice for hbmcoll.topology(); plus numa_report(), the
 * apply-nothing planner behind `python -m hbmcoll.topo`.
 */
#include "core.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "coll_numa.h"

typedef struct {
  PyObject_HEAD
  coll_numa_ctx_t *ctx;
  int local_rank;
} hb_placement_t;

/* -EINVAL: a setting no plan can follow (HBMCOLL_MEMORY, HBMCOLL_BIND, HBMCOLL_HBM_NODES or
 * the arguments); else what the system said. */
static PyObject *placement_error(hb_state_t *st, int rc, const char *what) {
  char text[256];
  if (rc == -EINVAL)
    snprintf(text, sizeof text, "%s: invalid placement setting (HBMCOLL_MEMORY, HBMCOLL_BIND, "
             "HBMCOLL_HBM_NODES or the arguments)", what);
  else
    snprintf(text, sizeof text, "%s: %s", what, coll_strerror(rc));
  return hb_raise(st, rc, text);
}

static PyObject *placement_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"local_rank", "local_size", NULL};
  int local_rank, local_size;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "ii", names, &local_rank, &local_size)) return NULL;
  coll_numa_ctx_t *ctx = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = coll_numa_setup(local_rank, local_size, &ctx);
  Py_END_ALLOW_THREADS
  if (rc) return placement_error(PyType_GetModuleState(type), rc, "placement setup");
  hb_placement_t *self = (hb_placement_t *)type->tp_alloc(type, 0);
  if (self == NULL) {
    coll_numa_free(ctx);
    return NULL;
  }
  self->ctx = ctx;
  self->local_rank = local_rank;
  return (PyObject *)self;
}

static void placement_dealloc(hb_placement_t *self) {
  PyTypeObject *tp = Py_TYPE(self);
  coll_numa_free(self->ctx);
  tp->tp_free(self);
  Py_DECREF(tp);
}

static PyObject *placement_report(hb_placement_t *self, PyObject *args) {
  int json = 1;
  if (!PyArg_ParseTuple(args, "|p", &json)) return NULL;
  char *text = NULL;
  int rc = coll_numa_ctx_report(self->ctx, json, &text);
  if (rc) return placement_error(PyType_GetModuleState(Py_TYPE(self)), rc, "placement report");
  PyObject *s = PyUnicode_FromString(text);
  free(text);
  return s;
}

static PyObject *placement_notice(hb_placement_t *self, void *c) {
  (void)c;
  return PyUnicode_FromString(coll_numa_notice(self->ctx));
}

static PyObject *placement_pu(hb_placement_t *self, void *c) {
  (void)c;
  int pu = coll_numa_rank_pu(self->ctx, self->local_rank);
  if (pu < 0) Py_RETURN_NONE;
  return PyLong_FromLong(pu);
}

static PyObject *placement_threads(hb_placement_t *self, void *c) {
  (void)c;
  return PyLong_FromLong(coll_numa_rank_threads(self->ctx, self->local_rank));
}

/* The coll_place_fn handed to libcoll: runs in C, no Python. A fallback (an hbm_bind that
 * does not fit, mbind refused: said once per node and context) is printed, as the setup's
 * notice is, unless HBMCOLL_QUIET is set; topology() lists it too. */
int hb_placement_place(void *arg, void *addr, size_t len, const int *local_ranks, int n) {
  char notice[512], line[540];
  int rc = coll_numa_place_segment(arg, addr, len, local_ranks, n, notice, sizeof notice, NULL);
  if (rc == 0 && notice[0] && !getenv("HBMCOLL_QUIET")) {
    int k = snprintf(line, sizeof line, "hbmcoll: %s\n", notice);
    if (k > 0 && write(2, line, (size_t)k < sizeof line ? (size_t)k : sizeof line - 1) < 0)
      return rc; /* nowhere to say it */
  }
  return rc;
}

void *hb_placement_ctx(PyObject *obj) { return ((hb_placement_t *)obj)->ctx; }

static PyMethodDef placement_methods[] = {
    {"report", (PyCFunction)placement_report, METH_VARARGS, "report(json=True) -> str"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef placement_getset[] = {
    {"notice", (getter)placement_notice, NULL, "one line on fallbacks, or ''", NULL},
    {"pu", (getter)placement_pu, NULL, "the first PU of this rank's CPU set, or None", NULL},
    {"threads", (getter)placement_threads, NULL,
     "compute threads the plan gives this rank (the cores of its share)", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyType_Slot placement_slots[] = {{Py_tp_new, placement_new},
                                        {Py_tp_dealloc, placement_dealloc},
                                        {Py_tp_methods, placement_methods},
                                        {Py_tp_getset, placement_getset},
                                        {0, NULL}};

PyType_Spec hb_placement_spec = {"hbmcoll._core.Placement", sizeof(hb_placement_t), 0,
                                 Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE, placement_slots};

PyObject *hb_numa_report(PyObject *module, PyObject *args, PyObject *kw) {
  static char *names[] = {"topology", "ranks", "memory", "bind", "json", "tree", NULL};
  const char *path = NULL, *memory = NULL, *bind = NULL;
  int ranks = 0, json = 1, tree = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|zizzpp", names, &path, &ranks, &memory, &bind, &json,
                                   &tree))
    return NULL;
  char *text = NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = (tree ? coll_numa_tree_report : coll_numa_report)(path, ranks, memory, bind, json, &text);
  Py_END_ALLOW_THREADS
  if (rc == -ENOENT) {
    char text[512];
    snprintf(text, sizeof text, "no topology at %s", path);
    return hb_raise(PyModule_GetState(module), rc, text);
  }
  if (rc) return placement_error(PyModule_GetState(module), rc, path ? path : "this machine");
  PyObject *s = PyUnicode_FromString(text);
  free(text);
  return s;
}

/* {"memory": (...), "bind": (...)}: the words the planner parses, for the CLIs' choices. */
PyObject *hb_policy_words(PyObject *module, PyObject *unused) {
  (void)module, (void)unused;
  PyObject *out = PyDict_New();
  for (int bind = 0; out && bind <= 1; bind++) {
    PyObject *words = PyList_New(0);
    for (int i = 0; words && coll_numa_policy_word(bind, i); i++) {
      PyObject *w = PyUnicode_FromString(coll_numa_policy_word(bind, i));
      if (w == NULL || PyList_Append(words, w) < 0) Py_CLEAR(words);
      Py_XDECREF(w);
    }
    PyObject *t = words ? PyList_AsTuple(words) : NULL;
    Py_XDECREF(words);
    if (t == NULL || PyDict_SetItemString(out, bind ? "bind" : "memory", t) < 0) Py_CLEAR(out);
    Py_XDECREF(t);
  }
  return out;
}
