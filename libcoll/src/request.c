/*
 * request.c - running collectives: coll_run (blocking) and coll_start (nonblocking).
 * Each communicator gets, on first use,
 * one progress thread that runs queued collectives in order. A blocking call
 * runs in the caller's thread when nothing is queued (no hand-off latency),
 * and otherwise joins the queue so the order stays the one the user wrote.
 *
 * Requests point at the worker, not at the communicator, and the worker
 * counts the requests not yet freed: coll_comm_free leaves it behind while
 * any remain (all of them finished), and the last coll_req_free frees it. So
 * waiting on, testing or freeing a request after coll_comm_free is fine.
 *
 * A point-to-point request (coll_isend, coll_irecv) is the same handle around an operation of
 * p2p.c (on a node) or nodes_p2p.c (across nodes), which have no worker: its wait, test, free,
 * status and cancel go to the operations table it came with.
 */
#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "coll_internal.h"
#include "nodes.h"
#include "round.h"

struct coll_req {
  void *p2p;                    /* a point-to-point operation, else NULL ... */
  const coll__req_ops_t *p2p_ops; /* ... and what waits for it, tests, frees it */
  coll__worker_t *worker;
  coll_args_t args;
  int finished;
  int result;
  coll_req_t *next;
};

struct coll__worker {
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t work;     /* queue not empty, or stop */
  pthread_cond_t finished; /* some request finished */
  coll_req_t *head, *tail;
  int pending; /* queued or running */
  int live;    /* started and not yet freed by coll_req_free */
  int stop;
  int orphaned; /* the communicator is gone: the last coll_req_free frees this */
  int (*execute)(void *owner, const coll_args_t *a); /* what runs a request */
  void *owner;  /* its communicator (or the layer across nodes, hier.c) */
};

static void *worker_main(void *arg) {
  coll__worker_t *w = arg;
  pthread_mutex_lock(&w->lock);
  for (;;) {
    while (!w->stop && w->head == NULL) pthread_cond_wait(&w->work, &w->lock);
    if (w->head == NULL) break;
    coll_req_t *r = w->head;
    int stopping = w->stop;
    w->head = r->next;
    if (w->head == NULL) w->tail = NULL;
    pthread_mutex_unlock(&w->lock);
    int rc = stopping ? COLL_EABORTED : w->execute(w->owner, &r->args);
    pthread_mutex_lock(&w->lock);
    r->result = rc;
    r->finished = 1;
    w->pending--;
    pthread_cond_broadcast(&w->finished);
  }
  pthread_mutex_unlock(&w->lock);
  return NULL;
}

int coll__worker_get(coll__worker_t **w_p, int (*execute)(void *owner, const coll_args_t *a), void *owner) {
  if (*w_p) return 0;
  coll__worker_t *w = calloc(1, sizeof *w);
  if (w == NULL) return -ENOMEM;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->work, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->finished, &ca);
  pthread_condattr_destroy(&ca);
  w->execute = execute, w->owner = owner;
  int rc = pthread_create(&w->thread, NULL, worker_main, w);
  if (rc != 0) {
    free(w);
    return -rc;
  }
  *w_p = w;
  return 0;
}

static int comm_execute(void *c, const coll_args_t *a) { return coll__execute(c, a); }

static void worker_destroy(coll__worker_t *w) {
  pthread_mutex_destroy(&w->lock);
  pthread_cond_destroy(&w->work);
  pthread_cond_destroy(&w->finished);
  free(w);
}

void coll__worker_end(coll__worker_t **w_p) {
  coll__worker_t *w = *w_p;
  if (w == NULL) return;
  pthread_mutex_lock(&w->lock);
  w->stop = 1; /* queued requests finish with COLL_EABORTED */
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->lock);
  pthread_join(w->thread, NULL);
  *w_p = NULL;
  pthread_mutex_lock(&w->lock);
  int keep = w->live > 0; /* requests not freed yet: the last one frees w */
  w->orphaned = keep;
  pthread_mutex_unlock(&w->lock);
  if (!keep) worker_destroy(w);
}

void coll__worker_stop(coll_comm_t *c) { coll__worker_end(&c->worker); }

int coll__worker_pending(coll__worker_t *w) {
  if (w == NULL) return 0;
  pthread_mutex_lock(&w->lock);
  int n = w->pending;
  pthread_mutex_unlock(&w->lock);
  return n;
}

int coll__worker_queue(coll__worker_t *w, const coll_args_t *a, coll_req_t **req_p) {
  coll_req_t *r = calloc(1, sizeof *r);
  if (r == NULL) return -ENOMEM;
  r->worker = w;
  r->args = *a;
  pthread_mutex_lock(&w->lock);
  if (w->tail) w->tail->next = r;
  else w->head = r;
  w->tail = r;
  w->pending++;
  w->live++;
  pthread_cond_signal(&w->work);
  pthread_mutex_unlock(&w->lock);
  *req_p = r;
  return 0;
}

void coll__worker_forget(coll_comm_t *c) {
  c->worker = NULL; /* its memory is the parent's copy; a leak of one struct in the child */
}

int coll_start(coll_comm_t *c, const coll_args_t *a, coll_req_t **req_p) {
  if (c == NULL || a == NULL || req_p == NULL) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (c->span || c->error_text[0]) coll__keep_text(c, ""); /* one load on one node's hot path */
  int rc = coll__check_args(c, a);
  if (rc) return rc;
  if (c->error) return c->error;
  if (c->span) return coll__span_start(c, a, req_p);
  if ((rc = coll__worker_get(&c->worker, comm_execute, c)) != 0) return rc;
  return coll__worker_queue(c->worker, a, req_p);
}

int coll__req_wrap_p2p(void *op, const coll__req_ops_t *ops, coll_req_t **req_p) {
  coll_req_t *r = calloc(1, sizeof *r);
  if (r == NULL) return -ENOMEM;
  r->p2p = op;
  r->p2p_ops = ops;
  *req_p = r;
  return 0;
}

int coll_req_status(coll_req_t *r, coll_status_t *status_p) {
  if (r == NULL || status_p == NULL || r->p2p == NULL) return COLL_EBADARG;
  return r->p2p_ops->status(r->p2p, status_p);
}

int coll_req_cancel(coll_req_t *r) {
  if (r == NULL) return COLL_EBADARG;
  if (r->p2p == NULL) return coll_req_test(r, NULL) ? -EALREADY : -EBUSY;
  return r->p2p_ops->cancel(r->p2p);
}

int coll_req_wait(coll_req_t *r, double timeout_s) {
  if (r == NULL) return COLL_EBADARG;
  if (r->p2p) return r->p2p_ops->wait(r->p2p, timeout_s);
  coll__worker_t *w = r->worker;
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  if (timeout_s >= 0) {
    double whole = (double)(long)timeout_s;
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&w->lock);
  int rc = 0;
  while (!r->finished && rc == 0)
    rc = timeout_s < 0 ? pthread_cond_wait(&w->finished, &w->lock)
                       : pthread_cond_timedwait(&w->finished, &w->lock, &until);
  int result = r->finished ? r->result : -ETIMEDOUT;
  pthread_mutex_unlock(&w->lock);
  return result;
}

int coll_req_test(coll_req_t *r, int *result_p) {
  if (r == NULL) return COLL_EBADARG;
  if (r->p2p) return r->p2p_ops->test(r->p2p, result_p);
  coll__worker_t *w = r->worker;
  pthread_mutex_lock(&w->lock);
  int fin = r->finished;
  if (fin && result_p) *result_p = r->result;
  pthread_mutex_unlock(&w->lock);
  return fin;
}

void coll_req_free(coll_req_t *r) {
  if (r == NULL) return;
  if (r->p2p) {
    r->p2p_ops->free(r->p2p);
    free(r);
    return;
  }
  coll_req_wait(r, -1);
  coll__worker_t *w = r->worker;
  pthread_mutex_lock(&w->lock);
  int last = --w->live == 0 && w->orphaned;
  pthread_mutex_unlock(&w->lock);
  free(r);
  if (last) worker_destroy(w);
}

/* Blocking: in my thread when nothing is queued, else behind the queued requests. */
static int run_ordered(coll_comm_t *c, const coll_args_t *a) {
  if (!coll__worker_pending(c->worker)) {
    c->allow_interrupt = 1;
    int rc = coll__execute(c, a);
    c->allow_interrupt = 0;
    return rc;
  }
  coll_req_t *r;
  int rc = coll_start(c, a, &r);
  if (rc) return rc;
  /* wait in slices so Ctrl-C still ends a blocking call queued behind requests */
  while ((rc = coll_req_wait(r, 0.05)) == -ETIMEDOUT && !coll_req_test(r, NULL)) {
    if (c->interrupt_fn && c->interrupt_fn(c->interrupt_arg)) {
      coll__fail(c, COLL_EPEERLOST, "rank %d was interrupted by a signal; the communicator is closed",
                 c->rank);
      coll_req_free(r); /* the abort ends what the worker runs */
      return COLL_EINTERRUPTED;
    }
  }
  if (coll_req_test(r, &rc) != 1) rc = coll_req_wait(r, -1);
  coll_req_free(r);
  return rc;
}

int coll_run(coll_comm_t *c, const coll_args_t *a) {
  if (c == NULL || a == NULL) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (c->span || c->error_text[0]) coll__keep_text(c, ""); /* one load on one node's hot path */
  int rc = coll__check_args(c, a);
  if (rc) return rc;
  if (c->error) return c->error;
  return c->span ? coll__span_run(c, a) : run_ordered(c, a);
}

int coll_comm_settle(coll_comm_t *c) {
  if (c == NULL) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (c->span) return coll__span_settle(c);
  /* the request thread's last call may be a give too: let it finish that (queued requests
   * fail with COLL_EABORTED, as at coll_comm_free), then its rounds are mine to check */
  coll__worker_stop(c);
  if (c->unchecked_seq == 0) return 0;
  if (c->error) return c->error;
  int rc = coll__aborted(c);
  if (rc == 0) {
    c->allow_interrupt = 1;
    rc = coll__settle(c);
    c->allow_interrupt = 0;
  }
  return rc;
}
