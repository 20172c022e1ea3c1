/*
 * core_share.c - telling a core shared with our own ranks from a core wanted by a task outside
 * the job, by how long a yield takes.
 *
 * Why. A rank waiting for another can give its core away two ways. A yield (sched_yield) costs
 * nothing when the core's other tasks are ranks of the job that wait too: each runs a poll and
 * yields back, in microseconds, and no core ever halts. Sleeping in the kernel costs a wake-up,
 * and in a VM waking a halted vCPU is an IPI and a VM exit, tens of microseconds each time (with
 * 4 ranks on 2 vCPUs, a few of those per collective tripled its time). But a yield to a task
 * that computes (a data loader, a busy loop) hands it a whole slice, milliseconds, at every
 * yield: that was the collapse under load. So a wait yields while yields come back quickly, and
 * blocks once one did not: the first long yield says the core is wanted, and for the next
 * COLL_CORE_WANTED_S every wait of this process blocks at once, then yields are tried again.
 *
 * A yield may also come back at once beside a busy process (the scheduler runs only the task
 * it owes time to, and just after the busy one's slice that is us): the wait then learns it from
 * the other side, a gap between two of its polls as long as a slice (coll__core_gap).
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

void coll__core_gap(double gap, double now) {
  if (gap >= COLL_CORE_YIELD_LONG_S)
    atomic_store_explicit(&share_until_ns, (int64_t)((now + COLL_CORE_WANTED_S) * 1e9), memory_order_relaxed);
}

int coll__core_yield(void) {
  double t0 = coll__core_now();
  sched_yield();
  double t1 = coll__core_now();
  coll__core_gap(t1 - t0, t1);
  return t1 - t0 >= COLL_CORE_YIELD_LONG_S;
}

int coll__core_wanted(double now) {
  return (int64_t)(now * 1e9) < atomic_load_explicit(&share_until_ns, memory_order_relaxed);
}
