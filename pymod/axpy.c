/*
 * axpy.c - hbmcoll._core.axpy(y, x, alpha, dtype): y += alpha * x over raw bytes, without the
 * GIL (the memory servers' accumulate, libcoll's coll__axpy).
 */
#include "core.h"

#include <string.h>

#include "coll_internal.h" /* coll__axpy */

/* The dtype named `name` ("float32", "bfloat16", ...; libcoll's names), or COLL_DTYPE_COUNT. */
coll_dtype_t hb_dtype_named(const char *name) {
  for (int d = 0; d < COLL_DTYPE_COUNT; d++)
    if (strcmp(coll_dtype_name((coll_dtype_t)d), name) == 0) return (coll_dtype_t)d;
  return COLL_DTYPE_COUNT;
}

/* axpy(y, x, alpha, dtype): y += alpha * x over raw bytes holding elements of dtype (a name:
 * "float32", "bfloat16", ...), without the GIL (the servers' accumulate). */
PyObject *hb_axpy(PyObject *m, PyObject *args) {
  Py_buffer y = {0}, x = {0};
  double alpha;
  const char *name;
  if (!PyArg_ParseTuple(args, "w*y*ds", &y, &x, &alpha, &name)) return NULL;
  coll_dtype_t dtype = hb_dtype_named(name);
  int rc = COLL_EBADARG;
  size_t es = dtype < COLL_DTYPE_COUNT ? coll_dtype_size(dtype) : 0;
  if (es && y.len == x.len && y.len % (Py_ssize_t)es == 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = coll__axpy(dtype, y.buf, x.buf, alpha, (size_t)y.len / es);
    Py_END_ALLOW_THREADS
  }
  PyBuffer_Release(&y), PyBuffer_Release(&x);
  if (rc) return hb_raise(PyModule_GetState(m), rc,
                          "axpy: y and x must be as long, of float16, bfloat16, float32, float64, or int32 or int64 with "
                          "an integer alpha");
  Py_RETURN_NONE;
}
