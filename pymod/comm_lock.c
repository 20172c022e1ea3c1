/*
 * comm_lock.c - one Python thread at a time per communicator.
 *
 * The fast path is one atomic exchange to take the flag and one to give it
 * back. A PyThread lock cost more: CPython 3.11 reads the clock on every
 * acquire, even a non-blocking one (a tenth of a small collective's cost in
 * Python). A thread that finds the flag taken waits on a condition variable
 * without the GIL, in 200 ms slices, so Ctrl-C still ends the wait; the holder
 * signals it only when someone waits (`waiters`, read after the flag is
 * given back: both are sequentially consistent, so either the holder sees
 * the waiter or the waiter sees the flag free).
 */
#include "core.h"

#include <time.h>

enum { LOCK_SLICE_MS = 200 }; /* Ctrl-C ends a wait within this */

/* Linux's pthread init calls cannot fail with default attributes. */
void hb_comm_lock_init(hb_comm_t *self) {
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&self->wait_cv, &attr);
  pthread_condattr_destroy(&attr);
  pthread_mutex_init(&self->wait_mu, NULL);
}

/* Both creation paths (Comm() and split) init right after tp_alloc. */
void hb_comm_lock_destroy(hb_comm_t *self) {
  pthread_cond_destroy(&self->wait_cv);
  pthread_mutex_destroy(&self->wait_mu);
}

static int lock_try(hb_comm_t *self) { return !atomic_exchange(&self->busy, 1); }

/* Without the GIL: 1 if the flag was taken within one slice. */
static int lock_wait_slice(hb_comm_t *self) {
  pthread_mutex_lock(&self->wait_mu);
  atomic_fetch_add(&self->waiters, 1);
  int got = lock_try(self);
  if (!got) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += LOCK_SLICE_MS * 1000000L;
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&self->wait_cv, &self->wait_mu, &until);
    got = lock_try(self);
  }
  atomic_fetch_sub(&self->waiters, 1);
  pthread_mutex_unlock(&self->wait_mu);
  return got;
}

int hb_comm_lock(hb_comm_t *self) {
  int got = self->comm != NULL && lock_try(self);
  while (!got && self->comm != NULL) {
    Py_BEGIN_ALLOW_THREADS
    got = lock_wait_slice(self);
    Py_END_ALLOW_THREADS
    if (!got && PyErr_CheckSignals() < 0) return -1;
  }
  if (self->comm == NULL) { /* closed, maybe while I waited */
    if (got) hb_comm_unlock(self);
    hb_raise(self->state, COLL_EABORTED, "the communicator is closed");
    return -1;
  }
  return 0;
}

void hb_comm_unlock(hb_comm_t *self) {
  atomic_exchange(&self->busy, 0);
  if (atomic_load(&self->waiters) == 0) return;
  pthread_mutex_lock(&self->wait_mu);
  pthread_cond_broadcast(&self->wait_cv);
  pthread_mutex_unlock(&self->wait_mu);
}
