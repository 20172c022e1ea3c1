/*
 * sync.c - publishing and waiting on the per-rank round flags.
 *
 * A wait spins with `pause` for a budget set from how many ranks share the
 * cores (spinning while a peer needs our core only delays it), then yields,
 * then sleeps on the peer's futex word in short slices. Every slice of the
 * slow path checks the abort flag, whether any peer died (pidfd), the
 * deadline, and (for calls from Python's thread) Ctrl-C.
 *
 * Wake-ups use the classic Dekker pairing: the publisher stores its flag, then
 * bumps `wake` and reads `sleepers`; a sleeper bumps `sleepers`, then re-reads
 * the flag before it sleeps on `wake`. Sequentially consistent fences between
 * the two steps on each side guarantee that one of them sees the other.
 */
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#define SYNC_SLICE_MS 10     /* futex sleep slice */
#define SYNC_CHECK_S 0.02    /* peer/interrupt/deadline checks in the slow path */
#define SYNC_YIELD_S 0.002   /* yield at most this long before sleeping */

static inline void sync_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static double sync_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sync_notify(coll__ctl_t *me) {
  atomic_fetch_add_explicit(&me->wake, 1, memory_order_seq_cst);
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&me->sleepers, memory_order_seq_cst) != 0)
    syscall(SYS_futex, &me->wake, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

void coll__publish_arrive(coll_comm_t *c, uint64_t round) {
  coll__ctl_t *me = &c->ctl[c->rank];
  /* entering round t means every read of earlier rounds is finished */
  if (atomic_load_explicit(&me->done, memory_order_relaxed) < round - 1)
    atomic_store_explicit(&me->done, round - 1, memory_order_release);
  atomic_store_explicit(&me->arrive, round, memory_order_release);
  sync_notify(me);
}

void coll__publish_done(coll_comm_t *c, uint64_t round) {
  coll__ctl_t *me = &c->ctl[c->rank];
  atomic_store_explicit(&me->done, round, memory_order_release);
  sync_notify(me);
}

void coll__wake_all(coll_comm_t *c) {
  for (int r = 0; r < c->size; r++) {
    atomic_fetch_add_explicit(&c->ctl[r].wake, 1, memory_order_seq_cst);
    syscall(SYS_futex, &c->ctl[r].wake, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
  }
}

int coll__fail(coll_comm_t *c, int code, const char *fmt, ...) {
  char text[COLL_TEXT_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (c->hdr == NULL) {
    c->error = code;
    snprintf(c->error_text, sizeof c->error_text, "%s", text);
    return code;
  }
  int32_t expected = 0;
  if (atomic_compare_exchange_strong(&c->hdr->abort_code, &expected, code)) {
    memcpy(c->hdr->abort_text, text, sizeof text);
    atomic_store(&c->hdr->abort_rank, c->rank);
    atomic_store(&c->hdr->abort_ready, 1);
    coll__wake_all(c);
  }
  return coll__check_abort(c);
}

/* 0 while healthy; else the communicator's failure code (same on all ranks). */
int coll__check_abort(coll_comm_t *c) {
  int code = atomic_load_explicit(&c->hdr->abort_code, memory_order_acquire);
  if (code == 0) return 0;
  if (c->error == 0) {
    for (int i = 0; i < 100000 && !atomic_load(&c->hdr->abort_ready); i++) sync_relax();
    c->error = code;
    snprintf(c->error_text, sizeof c->error_text, "%s", c->hdr->abort_text);
  }
  return c->error;
}

/* A peer whose process ended can never publish again. Only the peer being
 * waited for counts, and only if its flag is still short: a rank may finish
 * its part of the last collective and leave while others still wait on a
 * third rank (a waiter on a dead rank always finds out itself). */
static int sync_check_peer(coll_comm_t *c, int peer, _Atomic uint64_t *flag, uint64_t target) {
  int dead = 0;
  if (c->pidfd[peer] >= 0) {
    struct pollfd pfd = {c->pidfd[peer], POLLIN, 0};
    dead = poll(&pfd, 1, 0) > 0;
  } else if (c->ctl[peer].pid > 0 && c->ctl[peer].pidns != 0 &&
             c->ctl[peer].pidns == c->ctl[c->rank].pidns) {
    /* no pidfd (kernel < 5.3): its pid names it only in its own PID
     * namespace; from another one only the deadline catches a death */
    dead = kill(c->ctl[peer].pid, 0) != 0 && errno == ESRCH;
  }
  int left = atomic_load_explicit(&c->ctl[peer].left, memory_order_acquire);
  if ((!dead && !left) || atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
  if (left && !dead)
    return coll__fail(c, COLL_EPEERLOST, "rank %d (pid %d) closed the communicator; it is closed",
                      peer, (int)c->ctl[peer].pid);
  if (c->ctl[peer].pid == 0) /* died before it recorded its pid */
    return coll__fail(c, COLL_EPEERLOST, "rank %d died; the communicator is closed", peer);
  return coll__fail(c, COLL_EPEERLOST, "rank %d (pid %d) died; the communicator is closed", peer,
                    (int)c->ctl[peer].pid);
}

static int sync_wait(coll_comm_t *c, int peer, _Atomic uint64_t *flag, uint64_t target,
                     const char *what) {
  if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
  for (long i = 0; i < c->spin_iters; i++) {
    sync_relax();
    if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
    if ((i & 255) == 255 && atomic_load_explicit(&c->hdr->abort_code, memory_order_relaxed))
      return coll__check_abort(c);
  }
  coll__ctl_t *pc = &c->ctl[peer];
  double start = sync_now(), next_check = start + SYNC_CHECK_S;
  double deadline = start + c->params.timeout_s;
  int yields = 0;
  for (;;) {
    if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
    int rc = coll__check_abort(c);
    if (rc) return rc;
    double now = sync_now();
    if (yields < c->yield_budget && now - start < SYNC_YIELD_S) {
      yields++;
      sched_yield();
    } else {
      uint32_t w = atomic_load_explicit(&pc->wake, memory_order_seq_cst);
      atomic_fetch_add_explicit(&pc->sleepers, 1, memory_order_seq_cst);
      atomic_thread_fence(memory_order_seq_cst);
      if (atomic_load_explicit(flag, memory_order_acquire) < target &&
          !atomic_load(&c->hdr->abort_code)) {
        struct timespec ts = {0, SYNC_SLICE_MS * 1000000L};
        syscall(SYS_futex, &pc->wake, FUTEX_WAIT, w, &ts, NULL, 0);
      }
      atomic_fetch_sub_explicit(&pc->sleepers, 1, memory_order_seq_cst);
      now = sync_now();
    }
    if (now < next_check) continue;
    next_check = now + SYNC_CHECK_S;
    if ((rc = sync_check_peer(c, peer, flag, target)) != 0) return rc;
    if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
    if (c->allow_interrupt && c->interrupt_fn && c->interrupt_fn(c->interrupt_arg)) {
      coll__fail(c, COLL_EPEERLOST, "rank %d was interrupted by a signal; the communicator is closed",
                 c->rank);
      return COLL_EINTERRUPTED;
    }
    if (now >= deadline)
      return coll__fail(c, -ETIMEDOUT,
                        "rank %d timed out after %.0f s waiting for rank %d (%s, round %llu); "
                        "HBMCOLL_TIMEOUT sets the limit",
                        c->rank, c->params.timeout_s, peer, what, (unsigned long long)target);
  }
}

int coll__wait_arrive(coll_comm_t *c, int peer, uint64_t round) {
  int rc = sync_wait(c, peer, &c->ctl[peer].arrive, round, "arrival");
  if (rc == 0 && c->seen_done[peer] < round - 1) c->seen_done[peer] = round - 1;
  return rc;
}

int coll__wait_done(coll_comm_t *c, int peer, uint64_t round) {
  if (c->seen_done[peer] >= round) return 0;
  int rc = sync_wait(c, peer, &c->ctl[peer].done, round, "completion");
  if (rc == 0) c->seen_done[peer] = round;
  return rc;
}

int coll__wait_all_arrive(coll_comm_t *c, uint64_t round) {
  for (int k = 1; k < c->size; k++) { /* start after myself: spreads the polling */
    int rc = coll__wait_arrive(c, (c->rank + k) % c->size, round);
    if (rc) return rc;
  }
  return 0;
}

int coll__wait_all_done(coll_comm_t *c, uint64_t round) {
  for (int k = 1; k < c->size; k++) {
    int rc = coll__wait_done(c, (c->rank + k) % c->size, round);
    if (rc) return rc;
  }
  return 0;
}

int coll__slot_acquire(coll_comm_t *c, uint64_t round, int *parity_p) {
  int parity = (int)(round & 1);
  uint64_t need = c->slot_last_read[parity];
  int reader = c->slot_reader[parity];
  int rc = reader >= 0 ? coll__wait_done(c, reader, need) : coll__wait_all_done(c, need);
  if (rc) return rc;
  *parity_p = parity;
  return 0;
}

/* CPUs the whole job may use: the union of the ranks' affinity masks (a rank
 * pinned to one core still shares the job's cores), capped by the cgroup CPU
 * quota. Spinning pays off only while every rank has a CPU of its own. */
long coll__job_cpus(coll_comm_t *c) {
  long cpus = 0;
  for (int w = 0; w < 16; w++) {
    uint64_t u = 0;
    for (int r = 0; r < c->size; r++) u |= c->ctl[r].cpumask[w];
    cpus += __builtin_popcountll(u);
  }
  if (cpus == 0) cpus = sysconf(_SC_NPROCESSORS_ONLN);
  FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
  if (f) {
    char quota[32];
    long period = 0;
    if (fscanf(f, "%31s %ld", quota, &period) == 2 && strcmp(quota, "max") != 0 && period > 0) {
      long q = (atol(quota) + period - 1) / period;
      if (q > 0 && q < cpus) cpus = q;
    }
    fclose(f);
  }
  return cpus;
}
