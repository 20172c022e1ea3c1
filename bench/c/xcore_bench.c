/*
 * xcore_bench.c - what one core can get from another: the ceiling under medium and large
 * collectives with private (NumPy) buffers.
 *
 *   build/xcore_bench [bytes ...]          (default 32 KiB, 256 KiB, 1 MiB, 16 MiB)
 *
 * Two processes pinned to CPUs 0 and 1 (the first two allowed). Each iteration the writer
 * copies N bytes from a private buffer into shared memory and raises a flag; the reader waits
 * for it, copies the N bytes out into its own private buffer and answers. Reported: time per
 * iteration and N / time, the rate at which data written by one core reaches another core's
 * private memory when the two take turns. An allreduce of N bytes over 2 ranks must move at
 * least N such bytes into each rank (half the inputs, half the results, or all the inputs).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static cpu_set_t allowed; /* at start: the parent pins itself in every round */

static void pin(pid_t pid, int which) {
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &allowed) && seen++ == which) {
      CPU_SET(cpu, &one);
      sched_setaffinity(pid, sizeof one, &one);
      return;
    }
}

static void one_size(size_t n) {
  long iters = n <= (1 << 20) ? 2000 : 100;
  char *shm = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shm == MAP_FAILED) return;
  _Atomic long *flag = (_Atomic long *)shm, *ack = (_Atomic long *)(shm + 128);
  char *buf = shm + 4096;
  memset(buf, 0, n);
  pid_t child = fork();
  int reader = child == 0;
  if (!reader) { /* the parent places both, so the reader never waits to be scheduled where the
                  * writer spins (under SCHED_FIFO it would wait for ever) */
    pin(child, 1);
    pin(0, 0);
  }
  char *mine = malloc(n);
  memset(mine, reader ? 0 : 1, n);
  double t0 = now_s();
  for (long i = 1; i <= iters; i++) {
    if (!reader) {
      memcpy(buf, mine, n);
      atomic_store(flag, i);
      while (atomic_load(ack) < i) {}
    } else {
      while (atomic_load(flag) < i) {}
      memcpy(mine, buf, n);
      atomic_store(ack, i);
    }
  }
  double t = (now_s() - t0) / (double)iters;
  if (reader) _exit(0);
  waitpid(child, NULL, 0);
  printf("%9zu B: %8.2f us per turn, %6.2f GB/s core to core\n", n, t * 1e6, (double)n / t / 1e9);
  free(mine);
  munmap(shm, n + 4096);
}

int main(int argc, char **argv) {
  sched_getaffinity(0, sizeof allowed, &allowed);
  if (CPU_COUNT(&allowed) < 2) {
    fprintf(stderr, "xcore_bench: needs two CPUs\n");
    return 1;
  }
  if (argc > 1)
    for (int i = 1; i < argc; i++) one_size(strtoull(argv[i], NULL, 0));
  else
    for (size_t n = 32 << 10; n <= (16 << 20); n *= 8) one_size(n);
  return 0;
}
