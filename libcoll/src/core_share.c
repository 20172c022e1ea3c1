/*
 * core_share.c - telling a core shared with our own ranks from a core wanted by a task outside
 * the job, by how long a yield takes.
 *
 * Why. A rank of a node waiting for another spins, then yields for up to 2 ms, then sleeps on a
 * futex (sync.c). A yield costs nothing when the core's other tasks are ranks of the job that
 * wait too: each runs a poll and yields back, in microseconds. But a yield to a task that
 * computes (a data loader, a busy loop) hands it a whole slice, milliseconds, at every yield:
 * beside a busy process per core those 2 ms of yields cost several slices per wait. So a wait
 * yields while yields come back quickly, and sleeps once one did not: the first long yield says
 * the core is wanted, and for the next COLL_CORE_WANTED_S every node wait of this process goes
 * to its futex at once, then yields are tried again. (The bridge's waits, net_wait.c, already
 * block after a short spin.)
 *
 * The threshold sits between the two kinds of yield measured here: back from a rank of ours in
 * a few microseconds, back from a busy process after its slice (milliseconds). A rank of ours
 * that computes for longer than the threshold between its polls (a large reduction) also reads
 * as "wanted": the waits then block for a while, which is the choice that is never bad.
 */
#include "core_share.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

/* Until when the core counts as wanted, CLOCK_MONOTONIC ns; one for the process (every thread
 * that waits shares the answer). */
static _Atomic int64_t share_until_ns;

double coll__core_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void share_gap(double gap, double now) {
  if (gap >= COLL_CORE_YIELD_LONG_S)
    atomic_store_explicit(&share_until_ns, (int64_t)((now + COLL_CORE_WANTED_S) * 1e9), memory_order_relaxed);
}

int coll__core_yield(void) {
  double t0 = coll__core_now();
  sched_yield();
  double t1 = coll__core_now();
  share_gap(t1 - t0, t1);
  return t1 - t0 >= COLL_CORE_YIELD_LONG_S;
}

int coll__core_wanted(double now) {
  return (int64_t)(now * 1e9) < atomic_load_explicit(&share_until_ns, memory_order_relaxed);
}
