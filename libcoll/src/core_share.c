/*
 * core_share.c - telling a core shared with our own ranks from a core wanted by a task outside
 * the job, by how long a yield takes.
 *
 * Why. A rank of a node waiting for another spins, then yields for up to 2 ms, then sleeps on a
 * futex (sync.c). A yield costs nothing when the core's other tasks are ranks of the job that
 * wait too: each runs a poll and yields back, in microseconds. But a yield to a task that
 * computes (a data loader, a busy loop) hands it a whole slice, milliseconds, at every yield:
 * beside a busy process per core those 2 ms of yields cost several slices per wait. So a wait
 * yields while yields come back quickly, and sleeps once they did not: a long yield confirmed
 * (below) says the core is wanted, and for the next COLL_CORE_WANTED_S every node wait of this
 * process goes to its futex at once, then yields are tried again. (The bridge's waits,
 * net_wait.c, already block after a short spin.)
 *
 * Confirmed, because on a VM the hypervisor takes the vCPU away now and then (several gaps a
 * second over 300 us on an idle guest here), and a yield it lands in reads long with no task
 * beside us. Taken as a busy task, one such yield a second would keep every wait on its futex:
 * a build whose waits always slept ran the node's collectives 2-4x slower (bench/README.md).
 * So a long yield only arms a test: the thread's next long yield within COLL_CORE_CONFIRM_S is
 * timed with its run-queue delay (/proc/thread-self/schedstat) read before and after, which grows
 * while a task of this machine holds the core we are ready to run on, and not while the
 * hypervisor does. Grown by half the yield's length: the core is wanted. Beside a busy task one
 * yield in two or three is long (the others come back at once, ahead of its next slice), so it
 * says so at the second long one. Without schedstat, the second long yield says it.
 *
 * The threshold sits between the two kinds of yield measured here: back from a rank of ours in
 * a few microseconds, back from a busy process after its slice (milliseconds). A rank of ours
 * that computes for longer than the threshold between its polls (a large reduction) also reads
 * as "wanted": the waits then block for a while, which is the choice that is never bad.
 */
#include "core_share.h"

#include <fcntl.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Until when the core counts as wanted, CLOCK_MONOTONIC ns; one for the process (every thread
 * that waits shares the answer). */
static _Atomic int64_t share_until_ns;
/* Until when this thread's yields are tests of its last long one (CLOCK_MONOTONIC s). */
static _Thread_local double share_suspect_until;

double coll__core_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* This thread's time ready to run but not running, ns (the second field of its schedstat);
 * -1 where the kernel does not say (no file, or "0 0 0" where scheduler statistics are off).
 * Read around test yields only: a few microseconds. */
static long long share_run_delay_ns(void) {
  char buf[96];
  int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return -1;
  buf[n] = '\0';
  char *field, *end;
  unsigned long long ran = strtoull(buf, &field, 10);
  unsigned long long delay = strtoull(field, &end, 10);
  return field == buf || end == field || ran == 0 ? -1 : (long long)delay;
}

int coll__core_yield(void) {
  double t0 = coll__core_now();
  int test = t0 < share_suspect_until;
  long long delay0 = test ? share_run_delay_ns() : -1;
  sched_yield();
  double t1 = coll__core_now(), gap = t1 - t0;
  if (gap < COLL_CORE_YIELD_LONG_S) return 0; /* a test stays armed over quick yields */
  long long delay1 = test && delay0 >= 0 ? share_run_delay_ns() : -1;
  /* a test without schedstat: the second long yield says it */
  int a_task = test && (delay0 < 0 || delay1 < 0 || (double)(delay1 - delay0) >= 0.5e9 * gap);
  share_suspect_until = a_task ? 0 : t1 + COLL_CORE_CONFIRM_S;
  if (!a_task) return 1;
  atomic_store_explicit(&share_until_ns, (int64_t)((t1 + COLL_CORE_WANTED_S) * 1e9), memory_order_relaxed);
  return 2;
}

int coll__core_wanted(double now) {
  return (int64_t)(now * 1e9) < atomic_load_explicit(&share_until_ns, memory_order_relaxed);
}
