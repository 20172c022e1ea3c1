/*
 * test_core_share.c - a yield tells a core wanted by a busy process from one shared with our own
 * ranks (libcoll/src/core_share.c), and the waits act on it:
 *  - pinned to one CPU beside a busy process pinned there too, a yield hands it a slice: within
 *    a few yields a long one is confirmed by the next (coll__core_yield 2), the core then counts
 *    as wanted, and it stops counting COLL_CORE_WANTED_S later without another long yield;
 *  - yields made long by stopping the process now and then (SIGSTOP / SIGCONT from the other
 *    CPU: the vCPU taken away, as a hypervisor does) never make the core wanted;
 *  - a node wait (sync.c) that starts with the core wanted, for a rank 200 ms late, sleeps on
 *    its futex (voluntary context switches, getrusage; a wait that only yielded would have none)
 *    and still sees the late rank's arrival. Main's waits sleep there too, after 2 ms of
 *    yields: this case guards the property, the first one the detector.
 * Properties, not speeds: nothing here compares a time with a speed.
 */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "core_share.h"

#define HARNESS_KEY_PREFIX "hbcs"
#define MAX_RANKS 2
#include "harness.h"

/* A process that spins on `cpu` until killed; its pid. */
static pid_t busy_on(int cpu) {
  pid_t pid = fork();
  if (pid == 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
    for (volatile unsigned long k = 0;; k++) {
    }
  }
  return pid;
}

static void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof set, &set);
}

static void stop(pid_t pid) {
  if (pid > 0) kill(pid, SIGKILL), waitpid(pid, NULL, 0);
}

static void test_a_busy_neighbour_is_seen(void) {
  double t0 = now_s();
  pid_t busy = busy_on(0);
  pin_to(0);
  int longs = 0;
  for (double end = coll__core_now() + 3; longs < 2 && coll__core_now() < end;) longs = coll__core_yield();
  int wanted = coll__core_wanted(coll__core_now());
  stop(busy);
  double wake_at = coll__core_now() + COLL_CORE_WANTED_S + 0.02;
  while (coll__core_now() < wake_at) usleep(10000);
  int after = coll__core_wanted(coll__core_now());
  char why[160];
  snprintf(why, sizeof why, "a long yield: %d, wanted then: %d, wanted %.0f ms later: %d", longs, wanted,
           1e3 * (COLL_CORE_WANTED_S + 0.02), after);
  record(longs == 2 && wanted && !after, "a yield to a busy process reads as wanted, for a while", 1, now_s() - t0,
         longs == 2 && wanted && !after ? NULL : why);
}

/* This process's run-queue delay (schedstat), ns; -1 where the kernel does not say. */
static long long run_delay_ns(void) {
  FILE *f = fopen("/proc/self/schedstat", "r");
  unsigned long long ran = 0, delay = 0;
  int ok = f && fscanf(f, "%llu %llu", &ran, &delay) == 2 && ran > 0;
  if (f) fclose(f);
  return ok ? (long long)delay : -1;
}

/* In a child, pinned to CPU 0, whose process-wide state starts clean: yield for up to 3 s while
 * a process on CPU 1 stops and continues it every 2 ms, until 20 yields were long. 0 when the
 * core never counted as wanted, 2 when the test cannot tell (no schedstat, or another task
 * shared CPU 0 meanwhile: then the core was wanted). The thief stops on a shared flag, after
 * its SIGCONT: killed between the two, it would leave the child stopped for ever. */
static int stolen_yields(void) {
  _Atomic int *quit = mmap(NULL, sizeof *quit, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (quit == MAP_FAILED || run_delay_ns() < 0) return 2;
  pid_t me = getpid(), thief = fork();
  if (thief == 0) {
    pin_to(1);
    while (!atomic_load(quit)) {
      usleep(2000);
      kill(me, SIGSTOP);
      usleep(1000);
      kill(me, SIGCONT);
    }
    _exit(0);
  }
  pin_to(0);
  long long delay0 = run_delay_ns();
  int longs = 0, wanted = 0;
  double end = coll__core_now() + 3;
  while (longs < 20 && coll__core_now() < end) {
    longs += coll__core_yield() != 0;
    wanted |= coll__core_wanted(coll__core_now());
  }
  long long shared = run_delay_ns() - delay0;
  atomic_store(quit, 1);
  waitpid(thief, NULL, 0);
  if (shared > 20000000) return 2; /* 20 ms ready but not running: a real task was there */
  if (longs < 20 || wanted) {
    fprintf(stderr, "%d yields read long (20 wanted), core wanted: %d\n", longs, wanted);
    return 1;
  }
  return 0;
}

static void test_stolen_yields_are_not_a_task(void) {
  double t0 = now_s();
  pid_t pid = fork();
  if (pid == 0) _exit(stolen_yields());
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 2) {
    printf("skip yields made long by a stopped process: no schedstat, or CPU 0 was shared\n");
    return;
  }
  int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  record(ok, "yields made long by a stopped process do not make the core wanted", 1, now_s() - t0,
         ok ? NULL : "see the line above");
}

/* Rank 1 arrives 200 ms late; rank 0 waits beside a busy process on its CPU. 0, or 1 when rank
 * 0's wait never slept (no voluntary switch) or the barrier failed. */
static int rank_late_barrier(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c = NULL;
  if (comm_open(rank, size, key, 30, &c) != 0) return 1;
  pid_t busy = -1;
  pin_to(rank);
  if (rank == 0) {
    busy = busy_on(0);
    for (double end = coll__core_now() + 3; coll__core_yield() < 2 && coll__core_now() < end;) {
    } /* the wait below finds the core wanted */
  } else {
    usleep(200000);
  }
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  coll_args_t a = {.kind = COLL_BARRIER};
  int rc = coll_run(c, &a);
  getrusage(RUSAGE_SELF, &r1);
  stop(busy);
  coll_comm_free(c);
  if (rc != 0) return 1;
  if (rank == 0 && r1.ru_nvcsw == r0.ru_nvcsw) {
    fprintf(stderr, "rank 0 waited 200 ms beside a busy process without sleeping once\n");
    return 1;
  }
  return 0;
}

int main(void) {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) {
    printf("skip: one CPU\n0 passed, 0 failed\n");
    return 0;
  }
  test_stolen_yields_are_not_a_task();
  test_a_busy_neighbour_is_seen();
  spawn_expect("a node wait beside a busy process sleeps", 2, 60, NULL, rank_late_barrier, NULL, -1);
  printf("%lu passed, %lu failed\n", test_passed, test_failed);
  return test_failed ? 1 : 0;
}
