/*
 * errors.c - the one way a libcoll code becomes a Python exception: hbmcoll.errors.from_code
 * (Python, so C and Python code raise the same classes with the same .code), looked up
 * once when the module loads. The classes are re-exported from _core for old imports.
 */
#include "core.h"

int hb_errors_init(hb_state_t *st, PyObject *module) {
  PyObject *errors = PyImport_ImportModule("hbmcoll.errors");
  if (errors == NULL) return -1;
  st->from_code = PyObject_GetAttrString(errors, "from_code");
  static const char *exported[] = {"Error", "MismatchError", "PeerLostError", "TimeoutError",
                                   "ArgumentError", "OutOfMemoryError", NULL};
  int rc = st->from_code ? 0 : -1;
  for (int i = 0; rc == 0 && exported[i]; i++) {
    PyObject *cls = PyObject_GetAttrString(errors, exported[i]);
    rc = cls ? PyModule_AddObjectRef(module, exported[i], cls) : -1;
    Py_XDECREF(cls);
  }
  Py_DECREF(errors);
  return rc;
}

PyObject *hb_raise(hb_state_t *st, int code, const char *text) {
  PyObject *exc = PyObject_CallFunction(st->from_code, "is", code, text && *text ? text : NULL);
  if (exc == NULL) return NULL; /* the failure to build it is raised instead */
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *hb_bad_arg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyObject *text = PyUnicode_FromFormatV(fmt, ap);
  va_end(ap);
  PyObject *errors = text ? PyImport_ImportModule("hbmcoll.errors") : NULL;
  PyObject *exc = errors ? PyObject_CallMethod(errors, "from_code", "iO", COLL_EBADARG, text) : NULL;
  if (exc) PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_XDECREF(exc);
  Py_XDECREF(errors);
  Py_XDECREF(text);
  return NULL;
}
