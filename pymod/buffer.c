/*
 * buffer.c - turn a Python object into (pointer, bytes, dtype) without a copy:
 * the buffer protocol (NumPy, bytearray, memoryview) first, then DLPack
 * (`__dlpack__`, which torch tensors have, bfloat16 included); plain NumPy
 * arrays and torch tensors take a shorter way first (numpy_fast.c, torch_fast.c). Runs with the
 * GIL held; the collective then uses only the C fields.
 */
#include "core.h"

/* The DLPack ABI (dlpack.h v0.8), declared here to avoid a dependency. */
typedef struct {
  int32_t device_type, device_id;
} hb_dl_device_t;
typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} hb_dl_dtype_t;
typedef struct {
  void *data;
  hb_dl_device_t device;
  int32_t ndim;
  hb_dl_dtype_t dtype;
  int64_t *shape, *strides;
  uint64_t byte_offset;
} hb_dl_tensor_t;
typedef struct hb_dl_managed {
  hb_dl_tensor_t dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct hb_dl_managed *);
} hb_dl_managed_t;

enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4, DL_CPU = 1 };

static int buf_format_dtype(const char *fmt, Py_ssize_t itemsize, coll_dtype_t *dt) {
  if (fmt == NULL) fmt = "B";
  if (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++;
  if (fmt[0] == '\0' || fmt[1] != '\0') return -1;
  switch (fmt[0]) {
  case 'b': *dt = COLL_INT8; return 0;
  case 'B': *dt = COLL_UINT8; return 0;
  case 'i': case 'l': case 'q': case 'n':
    if (itemsize == 4) { *dt = COLL_INT32; return 0; }
    if (itemsize == 8) { *dt = COLL_INT64; return 0; }
    return -1;
  case 'e': *dt = COLL_FLOAT16; return 0;
  case 'f': *dt = COLL_FLOAT32; return 0;
  case 'd': *dt = COLL_FLOAT64; return 0;
  default: return -1;
  }
}

static int buf_dl_dtype(hb_dl_dtype_t t, coll_dtype_t *dt) {
  if (t.lanes != 1) return -1;
  if (t.code == DL_INT && t.bits == 8) *dt = COLL_INT8;
  else if (t.code == DL_UINT && t.bits == 8) *dt = COLL_UINT8;
  else if (t.code == DL_INT && t.bits == 32) *dt = COLL_INT32;
  else if (t.code == DL_INT && t.bits == 64) *dt = COLL_INT64;
  else if (t.code == DL_FLOAT && t.bits == 16) *dt = COLL_FLOAT16;
  else if (t.code == DL_BFLOAT && t.bits == 16) *dt = COLL_BFLOAT16;
  else if (t.code == DL_FLOAT && t.bits == 32) *dt = COLL_FLOAT32;
  else if (t.code == DL_FLOAT && t.bits == 64) *dt = COLL_FLOAT64;
  else return -1;
  return 0;
}

static int buf_from_dlpack(PyObject *obj, const char *name, int any_dtype, hb_buf_t *b) {
  PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
  if (cap == NULL) return -1;
  hb_dl_managed_t *m = PyCapsule_GetPointer(cap, "dltensor");
  if (m == NULL) {
    Py_DECREF(cap);
    return -1;
  }
  hb_dl_tensor_t *t = &m->dl_tensor;
  if (t->device.device_type != DL_CPU) {
    PyErr_Format(PyExc_TypeError, "%s: only CPU tensors are supported (DLPack device %d)", name,
                 t->device.device_type);
    goto fail;
  }
  if (any_dtype) {
    b->dtype = COLL_UINT8;
  } else if (buf_dl_dtype(t->dtype, &b->dtype) != 0) {
    PyErr_Format(PyExc_TypeError, "%s: unsupported dtype (DLPack code %d, %d bits)", name,
                 t->dtype.code, t->dtype.bits);
    goto fail;
  }
  size_t n = 1;
  int64_t expect = 1;
  int contiguous = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->strides && t->shape[i] > 1 && t->strides[i] != expect) contiguous = 0;
    expect *= t->shape[i];
    n *= (size_t)t->shape[i];
  }
  if (!contiguous && n > 0) { /* empty tensors have arbitrary strides */
    PyErr_Format(PyExc_BufferError, "%s must be C-contiguous (call .contiguous() first)", name);
    goto fail;
  }
  b->capsule = cap;
  b->ptr = (char *)t->data + t->byte_offset;
  b->nbytes = any_dtype ? n * (size_t)((t->dtype.bits * t->dtype.lanes + 7) / 8) : n * coll_dtype_size(b->dtype);
  return 0;
fail:
  Py_DECREF(cap); /* still named "dltensor": its destructor frees the tensor */
  return -1;
}

int hb_buf_get(PyObject *obj, int writable, const char *name, hb_buf_t *b) {
  memset(b, 0, sizeof *b);
  if (hb_np_get(obj, writable, b) == 0) return 0;
  if (hb_torch_get(obj, b) == 0) return 0;
  if (PyObject_CheckBuffer(obj)) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->view, flags) != 0) {
      if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError) ||
          PyErr_ExceptionMatches(PyExc_ValueError)) { /* NumPy says ValueError */
        PyErr_Clear();
        PyErr_Format(PyExc_BufferError, "%s must be a C-contiguous%s buffer", name,
                     writable ? ", writable" : "");
      }
      return -1;
    }
    b->has_view = 1;
    if (buf_format_dtype(b->view.format, b->view.itemsize, &b->dtype) != 0) {
      PyErr_Format(PyExc_TypeError,
                   "%s: unsupported element type '%s' (int8, uint8, int32, int64, float16, "
                   "bfloat16, float32, float64)",
                   name, b->view.format ? b->view.format : "B");
      hb_buf_release(b);
      return -1;
    }
    b->ptr = b->view.buf;
    b->nbytes = (size_t)b->view.len;
    return 0;
  }
  if (PyObject_HasAttrString(obj, "__dlpack__")) return buf_from_dlpack(obj, name, 0, b);
  PyErr_Format(PyExc_TypeError,
               "%s must support the buffer protocol or __dlpack__ (NumPy array, torch tensor, "
               "bytearray, memoryview), not %.100s",
               name, Py_TYPE(obj)->tp_name);
  return -1;
}

/* Point-to-point moves bytes: any element type, and misuse is hbmcoll.ArgumentError, as the
 * Python API has always said it (send/recv take C-contiguous buffers, a writable one to receive). */
int hb_buf_get_bytes(PyObject *obj, int writable, const char *name, hb_buf_t *b) {
  memset(b, 0, sizeof *b);
  if (hb_np_get(obj, writable, b) == 0) return 0;
  if (hb_torch_get(obj, b) == 0) return 0;
  if (PyObject_CheckBuffer(obj)) {
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) != 0) {
      PyErr_Clear();
      Py_buffer probe;
      int readonly = writable && PyObject_GetBuffer(obj, &probe, PyBUF_C_CONTIGUOUS) == 0;
      if (readonly) PyBuffer_Release(&probe);
      PyErr_Clear();
      hb_bad_arg(readonly ? "%s: the buffer is read-only" : "%s take C-contiguous buffers", name);
      return -1;
    }
    b->has_view = 1;
    b->dtype = COLL_UINT8;
    b->ptr = b->view.buf;
    b->nbytes = (size_t)b->view.len;
    return 0;
  }
  if (PyObject_HasAttrString(obj, "__dlpack__")) {
    if (buf_from_dlpack(obj, name, 1, b) == 0) return 0;
    if (PyErr_ExceptionMatches(PyExc_BufferError) || PyErr_ExceptionMatches(PyExc_TypeError)) {
      PyErr_Clear();
      hb_bad_arg("%s take contiguous CPU tensors", name);
    }
    return -1;
  }
  PyErr_Format(PyExc_TypeError, "%s take objects with the buffer protocol or __dlpack__ (NumPy "
               "array, torch tensor, bytearray, memoryview), not %.100s", name, Py_TYPE(obj)->tp_name);
  return -1;
}

void hb_buf_alias(hb_buf_t *b, const hb_buf_t *of) {
  *b = *of;
  b->has_view = 0; /* `of` releases the view */
  Py_XINCREF(b->capsule);
  Py_XINCREF(b->owner);
}

void hb_buf_release(hb_buf_t *b) {
  if (b->has_view) PyBuffer_Release(&b->view);
  b->has_view = 0;
  Py_CLEAR(b->capsule);
  Py_CLEAR(b->owner);
}
