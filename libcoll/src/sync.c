/*
 * sync.c - the shared-memory transport's signals: publishing and waiting on the
 * per-rank round flags in the segment's control lines.
 *
 * A wait spins with `pause` for a budget set from how many ranks share the
 * cores (spinning while a peer needs our core only delays it), then yields
 * while yields come back quickly (a yield to a busy process outside the job
 * hands it a whole slice: core_share.c), then sleeps on the peer's futex word
 * in short slices. Every slice of the
 * slow path checks the abort flag, whether any peer died (pidfd) or left,
 * the deadline (HBMCOLL_TIMEOUT; none by default), and (for calls from
 * Python's thread) Ctrl-C. A live peer that keeps us waiting gets a stall
 * warning (HBMCOLL_STALL_WARN, then at doubling intervals) naming the ranks
 * that have not arrived.
 *
 * Wake-ups use the classic Dekker pairing: the publisher stores its flag, then
 * bumps `wake` and reads `sleepers`; a sleeper bumps `sleepers`, then re-reads
 * the flag before it sleeps on `wake`. Sequentially consistent fences between
 * the two steps on each side guarantee that one of them sees the other.
 */
#include <errno.h>
#include <linux/futex.h>
#include <math.h>
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

#include "coll_internal.h"
#include "core_share.h"

#define SYNC_SLICE_MS 10     /* futex sleep slice */
#define SYNC_CHECK_S 0.02    /* peer/interrupt/deadline checks in the slow path */
#define SYNC_YIELD_S 0.002   /* yield at most this long before sleeping */

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
  coll__p2p_wake_all(c); /* point-to-point waiters sleep on doorbells of their own */
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
    c->hdr->abort_seq = c->seq;
    atomic_store(&c->hdr->abort_rank, c->rank);
    atomic_store(&c->hdr->abort_ready, 1);
    coll__wake_all(c);
  }
  return coll__check_abort(c);
}

void coll__warn(coll_comm_t *c, const char *fmt, ...) {
  char text[COLL_TEXT_MAX + 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (c->warn_fn) {
    c->warn_fn(c->warn_arg, text);
    return;
  }
  char line[COLL_TEXT_MAX + 80];
  int n = snprintf(line, sizeof line, "hbmcoll: %s\n", text);
  if (n > 0) {
    ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w; /* nowhere to report a failed warning */
  }
}

int coll__aborted(coll_comm_t *c) {
  return atomic_load_explicit(&c->hdr->abort_code, memory_order_relaxed) ? coll__check_abort(c) : 0;
}

/* 0 while healthy; else the communicator's failure code (same on all ranks). */
int coll__check_abort(coll_comm_t *c) {
  int code = atomic_load_explicit(&c->hdr->abort_code, memory_order_acquire);
  if (code == 0) return 0;
  if (c->error == 0) {
    for (int i = 0; i < 100000 && !atomic_load(&c->hdr->abort_ready); i++) coll__relax();
    c->error = code;
    snprintf(c->error_text, sizeof c->error_text, "%s", c->hdr->abort_text);
  }
  return c->error;
}

/* A peer whose process ended can never publish again. Only the peer being
 * waited for counts, and only if its flag is still short: a rank may finish
 * its part of the last collective and leave while others still wait on a
 * third rank (a waiter on a dead rank always finds out itself). */
int coll__peer_gone(coll_comm_t *c, int peer) {
  int dead = 0;
  if (c->pidfd[peer] >= 0) {
    struct pollfd pfd = {c->pidfd[peer], POLLIN, 0};
    dead = poll(&pfd, 1, 0) > 0;
  } else if (c->ctl[peer].pid > 0 && c->ctl[peer].pidns != 0 &&
             c->ctl[peer].pidns == c->ctl[c->rank].pidns) {
    dead = kill(c->ctl[peer].pid, 0) != 0 && errno == ESRCH;
  }
  if (dead) return 1;
  return atomic_load_explicit(&c->ctl[peer].left, memory_order_acquire) ? 2 : 0;
}

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
  if (left) /* it said goodbye: closed the communicator, or its process ended normally */
    return coll__fail(c, COLL_EPEERLOST,
                      "rank %d (pid %d) %s before collective #%llu (%s): it closed the "
                      "communicator or exited; the communicator is closed",
                      peer, (int)c->ctl[peer].pid, dead ? "exited" : "left",
                      (unsigned long long)coll__call_number(c),
                      coll_kind_name((coll_kind_t)c->tp->desc(c, c->rank, c->seq)->kind));
  if (c->ctl[peer].pid == 0) /* died before it recorded its pid */
    return coll__fail(c, COLL_EPEERLOST, "rank %d died; the communicator is closed", peer);
  return coll__fail(c, COLL_EPEERLOST, "rank %d (pid %d) died; the communicator is closed", peer,
                    (int)c->ctl[peer].pid);
}

/* A live peer is late: say who this rank waits for, in which collective, and
 * which other ranks have not got there either. Names, never a verdict: the
 * peers are alive (a dead one ends the wait), so it may be a checkpoint. */
static void sync_warn_stall(coll_comm_t *c, int peer, int arrival, uint64_t target,
                            const char *what, double waited) {
  char late[112] = "";
  size_t used = 0;
  int nlate = 0;
  for (int r = 0; r < c->size; r++) {
    uint64_t v = atomic_load_explicit(arrival ? &c->ctl[r].arrive : &c->ctl[r].done,
                                      memory_order_acquire);
    if (r == c->rank || v >= target) continue;
    if (used + 16 < sizeof late)
      used += (size_t)snprintf(late + used, sizeof late - used, "%s%d", nlate ? ", " : "", r);
    else if (used + 4 < sizeof late)
      used += (size_t)snprintf(late + used, sizeof late - used, ", ...");
    nlate++;
  }
  char where[64];
  if (c->creating)
    snprintf(where, sizeof where, "creating the communicator");
  else
    snprintf(where, sizeof where, "%s (collective #%llu)",
             coll_kind_name((coll_kind_t)c->tp->desc(c, c->rank, c->seq)->kind),
             (unsigned long long)coll__call_number(c));
  coll__warn(c, "rank %d has waited %.0f s in %s for rank %d (%s); %d rank(s) not there yet: "
                "%s. They are alive (a slow rank, or one that skipped this collective)%s",
             c->rank, waited, where, peer, what, nlate, late,
             c->params.timeout_s > 0 ? "" : "; HBMCOLL_TIMEOUT=S makes such a wait an error");
}

/* Whether the communicator's failure ends my wait: not one found in a later collective than
 * mine. A rank in a later collective has finished mine, so every rank took its part in
 * mine and what I wait for comes (a tree forwards it through ranks that are still in it);
 * a peer that dies on the way is found by my own check of it. */
static int sync_abort_applies(coll_comm_t *c) {
  if (atomic_load_explicit(&c->hdr->abort_code, memory_order_acquire) == 0) return 0;
  for (int i = 0; i < 100000 && !atomic_load(&c->hdr->abort_ready); i++) coll__relax();
  return !atomic_load(&c->hdr->abort_ready) || c->hdr->abort_seq <= c->seq || c->error;
}

/* The failure code, unless what I wait for has come meanwhile. */
static int sync_failed(coll_comm_t *c, _Atomic uint64_t *flag, uint64_t target) {
  int rc = coll__check_abort(c);
  return rc && atomic_load_explicit(flag, memory_order_acquire) < target ? rc : 0;
}

static int sync_wait(coll_comm_t *c, int peer, _Atomic uint64_t *flag, uint64_t target,
                     const char *what) {
  if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
  for (long i = 0; i < c->spin_iters; i++) {
    coll__relax();
    if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
    if ((i & 255) == 255 && atomic_load_explicit(&c->hdr->abort_code, memory_order_relaxed) &&
        sync_abort_applies(c))
      return sync_failed(c, flag, target);
  }
  coll__ctl_t *pc = &c->ctl[peer];
  double start = sync_now(), next_check = start + SYNC_CHECK_S;
  double deadline = c->params.timeout_s > 0 ? start + c->params.timeout_s : INFINITY;
  double stall = c->params.stall_warn_s, next_warn = stall > 0 ? start + stall : INFINITY;
  int yields = 0;
  for (;;) {
    if (atomic_load_explicit(flag, memory_order_acquire) >= target) return 0;
    int rc;
    if (sync_abort_applies(c)) return sync_failed(c, flag, target);
    double now = sync_now();
    if (yields < c->yield_budget && now - start < SYNC_YIELD_S && !coll__core_wanted(now)) {
      yields++;
      coll__core_yield(); /* a confirmed long one (a busy task holds the core): the futex from now on */
    } else {
      uint32_t w = atomic_load_explicit(&pc->wake, memory_order_seq_cst);
      atomic_fetch_add_explicit(&pc->sleepers, 1, memory_order_seq_cst);
      atomic_thread_fence(memory_order_seq_cst);
      if (atomic_load_explicit(flag, memory_order_acquire) < target && !sync_abort_applies(c)) {
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
    if (now >= next_warn) {
      sync_warn_stall(c, peer, flag == &c->ctl[peer].arrive, target, what, now - start);
      next_warn = start + 2 * (now - start); /* 60 s, 120 s, 240 s, ... */
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

/* A push's slices (algo_allreduce.c): rank q's slice is reduced by whichever rank claims it first,
 * so a rank whose core went to another task holds up nobody. The claim word holds the round and
 * the claimant (round << COLL_SLICE_RANK_BITS | rank) and only grows; waiters watch the claimant,
 * whose death, not the owner's, leaves the slice unwritten. */
#define COLL_SLICE_RANK_MASK ((1u << COLL_SLICE_RANK_BITS) - 1)
/* my rank as a claim names it (beyond the mask, claims name nobody: each rank claims only its own) */
static uint64_t coll__slice_by(const coll_comm_t *c) { return (uint64_t)c->rank & COLL_SLICE_RANK_MASK; }

int coll__claim_slice(coll_comm_t *c, int owner, uint64_t round) {
  _Atomic uint64_t *w = &c->ctl[owner].slice_claim;
  uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
  while (v >> COLL_SLICE_RANK_BITS < round)
    if (atomic_compare_exchange_weak_explicit(w, &v, round << COLL_SLICE_RANK_BITS | coll__slice_by(c),
                                              memory_order_acq_rel, memory_order_relaxed))
      return 1;
  return 0;
}

void coll__publish_slice(coll_comm_t *c, int owner, uint64_t round) {
  atomic_store_explicit(&c->ctl[owner].slice_done, round, memory_order_release);
  sync_notify(&c->ctl[c->rank]); /* its waiters sleep on the claimant's (my) wake word */
}

int coll__wait_slice(coll_comm_t *c, int owner, uint64_t round) {
  if (atomic_load_explicit(&c->ctl[owner].slice_done, memory_order_acquire) >= round) return 0;
  /* every rank waiting here has tried to claim every slice: each has its claimant by now */
  uint64_t v = atomic_load_explicit(&c->ctl[owner].slice_claim, memory_order_acquire);
  int by = v >> COLL_SLICE_RANK_BITS == round && c->size <= (int)COLL_SLICE_RANK_MASK + 1 ? (int)(v & COLL_SLICE_RANK_MASK) : owner;
  return sync_wait(c, by, &c->ctl[owner].slice_done, round, "a push's slice");
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
