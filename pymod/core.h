/* core.h - shared declarations of the hbmcoll._core extension. */
#ifndef HBMCOLL_CORE_H
#define HBMCOLL_CORE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>

#include "coll.h"

typedef struct {
  PyObject *from_code; /* hbmcoll.errors.from_code: the one code -> exception mapping */
  PyTypeObject *CommType, *RequestType, *P2PRequestType, *ArenaBufferType, *PlacementType, *BridgeType,
      *PoolMemoryType, *MemServeType, *PreparedType;
} hb_state_t;

/* A buffer held for the length of a collective: buffer protocol or DLPack. */
typedef struct {
  Py_buffer view;
  int has_view;
  PyObject *capsule; /* DLPack capsule kept alive while in use */
  PyObject *owner;   /* the array itself, on NumPy's fast path (numpy_fast.c) */
  void *ptr;
  size_t nbytes;
  coll_dtype_t dtype;
} hb_buf_t;

typedef struct {
  PyObject_HEAD
  coll_comm_t *comm;
  atomic_int busy; /* one Python thread at a time (comm_lock.c) */
  atomic_int waiters;
  pthread_mutex_t wait_mu;
  pthread_cond_t wait_cv;
  hb_state_t *state;
  PyObject *placement; /* Placement the segment was placed with, or NULL */
  coll_comm_t *kept;   /* closed, but arena arrays still point into its mapping */
  Py_ssize_t arena_live; /* ArenaBuffers not yet released */
  unsigned long owner_thread; /* the only thread that may issue collectives ... */
  int any_thread;             /* ... unless the caller orders them itself (torch backend) */
  atomic_int p2p_users;       /* point-to-point calls in flight (p2p.c: they take no lock) */
  int p2p_closing;            /* close() waits for them and refuses new ones */
} hb_comm_t;

/* _core.c: a Comm around c (taken), NULL with an exception (c freed) */
PyObject *hb_comm_wrap(hb_state_t *st, coll_comm_t *c, PyObject *placement, int any_thread);

/* buffer.c */
int hb_buf_get(PyObject *obj, int writable, const char *name, hb_buf_t *b);
/* For waits without the GIL: runs Python's signal handlers; nonzero (the exception set on this
 * thread) when one raised, e.g. KeyboardInterrupt on Ctrl-C. */
int hb_interrupt(void *arg);
void hb_buf_release(hb_buf_t *b);
/* The same for point-to-point: raw bytes of any element type; misuse is ArgumentError. */
int hb_buf_get_bytes(PyObject *obj, int writable, const char *name, hb_buf_t *b);
void hb_buf_alias(hb_buf_t *b, const hb_buf_t *of); /* b: the same buffer as of, held again */

/* numpy_fast.c: 0 = filled from a plain ndarray, 1 = not handled (use the buffer protocol) */
int hb_np_init(void); /* 1: plain NumPy arrays take the shortcut (numpy_fast.c) */
int hb_np_get(PyObject *obj, int writable, hb_buf_t *b);
int hb_torch_get(PyObject *obj, hb_buf_t *b); /* 0: a plain torch CPU tensor (torch_fast.c) */

/* errors.c: raise the hbmcoll.errors exception of a libcoll code (text NULL: the code's own);
 * returns NULL */
int hb_errors_init(hb_state_t *st, PyObject *module);
PyObject *hb_raise(hb_state_t *st, int code, const char *text);
/* raise hbmcoll.ArgumentError (COLL_EBADARG) with a PyUnicode_FromFormat text; NULL */
PyObject *hb_bad_arg(const char *fmt, ...);
/* comm_lock.c */
void hb_comm_lock_init(hb_comm_t *self);
void hb_comm_lock_destroy(hb_comm_t *self);
int hb_comm_lock(hb_comm_t *self);
void hb_comm_unlock(hb_comm_t *self);
/* Build coll_args_t from Python objects; holds the buffers in send/recv. */
int hb_prepare(hb_state_t *st, int size, int rank, int kind, PyObject *send, PyObject *recv, int op,
               int root, coll_args_t *a, hb_buf_t *sb, hb_buf_t *rb);

/* arena_buffer.c */
extern PyType_Spec hb_arena_spec;
PyObject *hb_comm_arena_alloc(hb_comm_t *self, PyObject *args); /* Comm.arena_alloc(nbytes) */

/* _core.c: run()'s arguments (kind, send, recv, op, root), range-checked */
int hb_parse_run(hb_comm_t *self, PyObject *const *args, Py_ssize_t n, int *kind, PyObject **send,
                 PyObject **recv, int *op, int *root);
/* prepared.c: Comm.prepare(...) -> Prepared, a collective run by calling it */
extern PyType_Spec hb_prepared_spec;
PyObject *hb_comm_prepare(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs);

/* request.c */
extern PyType_Spec hb_request_spec;
PyObject *hb_request_new(hb_comm_t *comm, coll_req_t *req, hb_buf_t *sb, hb_buf_t *rb);

/* p2p.c: Comm.send/recv/isend/irecv (coll_send, ...) and their requests */
extern PyType_Spec hb_p2p_request_spec;
PyObject *hb_comm_send(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hb_comm_recv(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hb_comm_isend(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs);
PyObject *hb_comm_irecv(hb_comm_t *self, PyObject *const *args, Py_ssize_t nargs);
/* close(): refuse new point-to-point calls and wait for those in flight; -1 (KeyboardInterrupt) */
int hb_p2p_drain(hb_comm_t *self);
/* _core.c: the exception of a failed call (KeyboardInterrupt already set for COLL_EINTERRUPTED) */
PyObject *hb_comm_raise(hb_comm_t *self, int rc);
int hb_comm_usable(hb_comm_t *self); /* _core.c: 0, or -1 with the exception of a closed or foreign Comm */
PyObject *hb_comm_run_v(hb_comm_t *self, PyObject *args); /* vcoll.c: Comm.run_v */

/* placement.c */
extern PyType_Spec hb_placement_spec;
int hb_placement_place(void *arg, void *addr, size_t len, const int *local_ranks, int n);
void *hb_placement_ctx(PyObject *placement);
PyObject *hb_numa_report(PyObject *module, PyObject *args, PyObject *kw);
PyObject *hb_policy_words(PyObject *module, PyObject *unused);
PyObject *hb_variables(PyObject *module, PyObject *unused); /* variables.c */

/* bridge.c */
extern PyType_Spec hb_bridge_spec;
extern PyType_Spec hb_pool_memory_spec;
extern PyType_Spec hb_memserve_spec;
struct coll__net;
struct coll__net *hb_bridge_net(PyObject *bridge);
/* join.c: a job across nodes (join_nodes), and who is where on it (Comm.span) */
PyObject *hb_join_nodes(PyObject *module, PyObject *args, PyObject *kw);
PyObject *hb_comm_span(hb_comm_t *self, PyObject *unused);
double hb_now(void);                /* bridge.c: CLOCK_MONOTONIC, seconds */
coll_dtype_t hb_dtype_named(const char *name); /* COLL_DTYPE_COUNT: no such name */
PyObject *hb_axpy(PyObject *m, PyObject *args);

#endif
