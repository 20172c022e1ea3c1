/*
 * torch_fast.c - the hot path for plain torch CPU tensors.
 *
 * `__dlpack__` makes torch build a capsule, a managed tensor and a deleter
 * per export, which made an 8-byte collective of torch tensors several times
 * slower than of NumPy arrays (bench/README.md, "Measurements behind the
 * code"). For an exact torch.Tensor we ask the tensor itself instead
 * (data_ptr(), nbytes, dtype and the flags below, a fraction of an export's
 * cost) and hold a reference for the length of the call. Anything else
 * (a subclass, a tensor that requires grad, one on another device, not
 * contiguous, with a lazy negation, or of a dtype hbmcoll lacks) goes the
 * general way in buffer.c, which exports it or says what is wrong, as before.
 * torch is never imported here: a tensor exists only once it has been.
 */
#include "core.h"

#include <string.h>

static PyTypeObject *tensor_type; /* torch.Tensor, once seen */
static PyObject *dtypes[8];       /* torch.<name> for each coll dtype below */
enum { REQUIRES_GRAD, IS_CPU, IS_CONTIGUOUS, IS_NEG, DTYPE, DATA_PTR, NBYTES, NAMES };
static const char *attr_names[NAMES] = {"requires_grad", "is_cpu", "is_contiguous", "is_neg",
                                        "dtype", "data_ptr", "nbytes"};
static PyObject *attrs[NAMES]; /* interned */
static const char *dtype_names[8] = {"int8",    "uint8",    "int32",   "int64",
                                     "float16", "bfloat16", "float32", "float64"};
static const coll_dtype_t dtype_codes[8] = {COLL_INT8,    COLL_UINT8,    COLL_INT32,
                                            COLL_INT64,   COLL_FLOAT16,  COLL_BFLOAT16,
                                            COLL_FLOAT32, COLL_FLOAT64};

/* The torch module's Tensor type and dtypes, the first time a "Tensor" comes. */
static int torch_load(void) {
  for (int i = 0; i < NAMES; i++)
    if (attrs[i] == NULL && (attrs[i] = PyUnicode_InternFromString(attr_names[i])) == NULL) return -1;
  PyObject *name = PyUnicode_FromString("torch");
  if (name == NULL) return -1;
  PyObject *mod = PyImport_GetModule(name);
  Py_DECREF(name);
  if (mod == NULL) return -1;
  PyObject *t = PyObject_GetAttrString(mod, "Tensor");
  int ok = t != NULL && PyType_Check(t);
  for (int i = 0; ok && i < 8; i++) ok = (dtypes[i] = PyObject_GetAttrString(mod, dtype_names[i])) != NULL;
  Py_DECREF(mod);
  if (!ok) {
    Py_XDECREF(t);
    for (int i = 0; i < 8; i++) Py_CLEAR(dtypes[i]);
    return -1;
  }
  tensor_type = (PyTypeObject *)t; /* kept for the life of the process, as torch is */
  return 0;
}

static PyObject *get(PyObject *obj, int attr, int call) {
  return call ? PyObject_CallMethodNoArgs(obj, attrs[attr]) : PyObject_GetAttr(obj, attrs[attr]);
}

/* 1 if obj.<attr> (or obj.<attr>()) is True, 0 if it is not, -1 on error. */
static int attr_true(PyObject *obj, int attr, int call) {
  PyObject *v = get(obj, attr, call);
  if (v == NULL) return -1;
  int r = v == Py_True;
  Py_DECREF(v);
  return r;
}

static int size_attr(PyObject *obj, int attr, int call, size_t *out) {
  PyObject *v = get(obj, attr, call);
  if (v == NULL) return -1;
  *out = (size_t)PyLong_AsSize_t(v);
  Py_DECREF(v);
  return *out == (size_t)-1 && PyErr_Occurred() ? -1 : 0;
}

int hb_torch_get(PyObject *obj, hb_buf_t *b) {
  PyTypeObject *tp = Py_TYPE(obj);
  if (tensor_type == NULL) {
    if (strcmp(tp->tp_name, "Tensor") != 0 || torch_load() != 0) {
      PyErr_Clear();
      return 1;
    }
  }
  if (tp != tensor_type) return 1;
  if (attr_true(obj, REQUIRES_GRAD, 0) != 0 || attr_true(obj, IS_CPU, 0) != 1 ||
      attr_true(obj, IS_CONTIGUOUS, 1) != 1 || attr_true(obj, IS_NEG, 1) != 0)
    goto general;
  PyObject *dt = get(obj, DTYPE, 0);
  if (dt == NULL) goto general;
  int k = 0;
  while (k < 8 && dtypes[k] != dt) k++;
  Py_DECREF(dt);
  if (k == 8) goto general;
  size_t addr, nbytes;
  if (size_attr(obj, DATA_PTR, 1, &addr) != 0 || size_attr(obj, NBYTES, 0, &nbytes) != 0)
    goto general;
  b->ptr = (void *)addr;
  b->nbytes = nbytes;
  b->dtype = dtype_codes[k];
  b->owner = Py_NewRef(obj);
  return 0;
general: /* buffer.c says what is wrong, as it did before this path */
  PyErr_Clear();
  return 1;
}
