/*
 * numpy_fast.c - the hot path for plain NumPy arrays.
 *
 * The buffer protocol costs NumPy some 600 instructions per array (it builds
 * a format string and a cached info block on every export), which is most of
 * a small collective's overhead. For an exact ndarray of a built-in dtype we
 * read pointer, size, flags and type straight from the array instead, and
 * hold a reference for the length of the call (NumPy then refuses a resize
 * that would free the memory). Anything else (subclasses, other dtypes, a
 * non-contiguous or read-only array where a writable one is needed) goes the
 * general way in buffer.c, which also writes the error messages. Built only
 * where NumPy's headers were found (setup.py defines HB_HAVE_NUMPY).
 */
#include "core.h"

#ifdef HB_HAVE_NUMPY
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL hb_numpy_api
#include <numpy/arrayobject.h>

static int np_ready; /* NumPy's C API table is loaded */

int hb_np_init(void) {
  if (np_ready) return 1;
  if (_import_array() < 0) { /* no NumPy at run time: buffer protocol only */
    PyErr_Clear();
    return 0;
  }
  np_ready = 1;
  return 1;
}

static int np_dtype(int type_num, coll_dtype_t *dt) {
  switch (type_num) {
  case NPY_INT8: *dt = COLL_INT8; return 0;
  case NPY_UINT8: *dt = COLL_UINT8; return 0;
  case NPY_INT32: *dt = COLL_INT32; return 0;
  case NPY_INT64: *dt = COLL_INT64; return 0;
#if NPY_SIZEOF_LONGLONG == 8 && NPY_LONGLONG != NPY_INT64
  case NPY_LONGLONG: *dt = COLL_INT64; return 0;
#endif
  case NPY_FLOAT16: *dt = COLL_FLOAT16; return 0;
  case NPY_FLOAT32: *dt = COLL_FLOAT32; return 0;
  case NPY_FLOAT64: *dt = COLL_FLOAT64; return 0;
  default: return -1;
  }
}

int hb_np_get(PyObject *obj, int writable, hb_buf_t *b) {
  if (!np_ready || !PyArray_CheckExact(obj)) return 1;
  PyArrayObject *arr = (PyArrayObject *)obj;
  int need = NPY_ARRAY_C_CONTIGUOUS | (writable ? NPY_ARRAY_WRITEABLE : 0);
  if ((PyArray_FLAGS(arr) & need) != need || !PyArray_ISNBO(PyArray_DESCR(arr)->byteorder))
    return 1;
  if (np_dtype(PyArray_TYPE(arr), &b->dtype) != 0) return 1;
  b->ptr = PyArray_DATA(arr);
  b->nbytes = (size_t)PyArray_NBYTES(arr);
  b->owner = Py_NewRef(obj);
  return 0;
}

#else
int hb_np_init(void) { return 0; }
int hb_np_get(PyObject *obj, int writable, hb_buf_t *b) {
  (void)obj, (void)writable, (void)b;
  return 1;
}
#endif
