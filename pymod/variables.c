/*
 * variables.c - hbmcoll._core.variables(): libcoll's one list of the HBMCOLL_* variables
 * (coll_variables), for docs/reference.md's generated table and `python -m hbmcoll.variables`.
 */
#include "core.h"

PyObject *hb_variables(PyObject *module, PyObject *unused) {
  (void)module, (void)unused;
  size_t n;
  const coll_variable_t *v = coll_variables(&n);
  PyObject *out = PyTuple_New((Py_ssize_t)n);
  for (size_t i = 0; out && i < n; i++) {
    PyObject *row = Py_BuildValue("{ssssssss}", "name", v[i].name, "scope", v[i].scope, "meaning",
                                  v[i].meaning, "default", v[i].fallback);
    if (row == NULL) Py_CLEAR(out);
    else PyTuple_SET_ITEM(out, (Py_ssize_t)i, row);
  }
  return out;
}
