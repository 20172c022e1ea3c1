/*
 * coll_bench.c - the C path alone, for profiling and tuning (no Python, no launcher).
 *
 *   build/coll_bench [-n ranks] [-c allreduce|bcast|gather|reduce|allgather] [-s bytes]
 *                    [-i iters] [-w warmup] [-b rotating buffers] [-a algo] [-z] [-u] [-F reps]
 *
 * Forks the ranks, builds one communicator, runs the OSU loop (barrier, warm-up, timed loop)
 * with float32 data that changes every iteration, checks the last result, and prints the
 * mean microseconds per call on rank 0 (the max over ranks). -z puts the buffers in the
 * arena (hbmcoll.empty). Rank r is pinned to the r-th allowed CPU (round robin), as the
 * Python launcher's placement does; -u leaves the ranks unpinned. -F R (allreduce, gather):
 * R times in turn, the library's loop and the same loop with bench/c/staged_floor.c's bare
 * kernels in each of their schedules (the least the data movement costs), on the same
 * buffers; prints the medians and the library's time over each.
 * `make bench-c ARGS=...` builds it with the extension's flags.
 * `make bench-c-profile` runs one rank under callgrind: an instruction count of the call
 * path that repeats exactly whatever else the machine does (with more ranks the count
 * would include the spinning waits, which depend on timing).
 */
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

/* bench/c/staged_floor.c: the bare kernels -F compares with, in every schedule it has */
typedef int (*floor_fn)(void *shared, int me, int P, const float *in, float *out, size_t n);
int staged_floor_rsag(void *shared, int me, int P, const float *in, float *out, size_t n);
int staged_floor_flat(void *shared, int me, int P, const float *in, float *out, size_t n);
int staged_floor_rsag_nt(void *shared, int me, int P, const float *in, float *out, size_t n);
int staged_floor_gather(void *shared, int me, int P, int root, int how, const float *in,
                        float *out, size_t n);
size_t staged_floor_bytes(int P);
enum { FLOOR_SCHEDULES = 3, MAX_REPS = 64 };
static const floor_fn floor_allreduce[FLOOR_SCHEDULES] = {staged_floor_rsag, staged_floor_flat,
                                                          staged_floor_rsag_nt};
static const char *const floor_names[2][FLOOR_SCHEDULES] = {{"rsag", "flat", "rsag_nt"},
                                                            {"memcpy", "movsb", "nt"}};
static void *floor_shared; /* mapped before the fork */

typedef struct {
  int P, iters, warm, nbuf, zc, unpinned, floor_reps;
  size_t bytes;
  coll_kind_t kind;
  const char *algo;
} opts_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static coll_kind_t parse_kind(const char *s) {
  static const struct { const char *name; coll_kind_t kind; } k[] = {
      {"allreduce", COLL_ALLREDUCE}, {"bcast", COLL_BCAST}, {"gather", COLL_GATHER},
      {"reduce", COLL_REDUCE}, {"allgather", COLL_ALLGATHER}, {"barrier", COLL_BARRIER}};
  for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
    if (strcmp(s, k[i].name) == 0) return k[i].kind;
  fprintf(stderr, "coll_bench: unknown collective %s\n", s);
  exit(2);
}

static void *buf_alloc(coll_comm_t *c, const opts_t *o, size_t bytes) {
  void *p = NULL;
  if (o->zc) {
    if (coll_arena_alloc(c, bytes, 64, &p) != 0) return NULL;
  } else if (posix_memalign(&p, 64, bytes) != 0) {
    return NULL;
  }
  memset(p, 0, bytes);
  return p;
}

/* Pins the calling rank to the (rank mod n)-th CPU it is allowed to run on. */
static void pin_rank(int rank) {
  cpu_set_t allowed, one;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return;
  int n = CPU_COUNT(&allowed), want = rank % n;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &allowed) && want-- == 0) {
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* -F: [library, kernel schedules...][rep] on this rank, seconds per call */
static double floor_times[1 + FLOOR_SCHEDULES][MAX_REPS];

/* One call: the library (which = 0) or the bare kernel in schedule which - 1. */
static int one_call(coll_comm_t *c, const opts_t *o, int rank, float *send, float *recv,
                    size_t n, int which) {
  if (which == 0) {
    coll_args_t a = {.kind = o->kind, .dtype = COLL_FLOAT32, .op = COLL_SUM, .root = 0,
                     .count = n, .send = send, .recv = o->kind == COLL_BCAST ? send : recv};
    return coll_run(c, &a);
  }
  if (o->kind == COLL_GATHER)
    return staged_floor_gather(floor_shared, rank, o->P, 0, which - 1, send, recv, n);
  return floor_allreduce[which - 1](floor_shared, rank, o->P, send, recv, n);
}

/* The OSU loop: warm-up, barrier, timed loop over the rotating buffers. Seconds per call,
 * or -1 (the error printed). */
static double timed_loop(coll_comm_t *c, const opts_t *o, int rank, float **send, float **recv,
                         size_t n, int which) {
  coll_args_t bar = {.kind = COLL_BARRIER, .dtype = COLL_FLOAT32};
  double t0 = 0;
  int rc = 0;
  for (int it = 0; it < o->warm + o->iters && rc == 0; it++) {
    if (it == o->warm) {
      rc = coll_run(c, &bar);
      t0 = now_s();
    }
    int k = it % o->nbuf;
    if (n) send[k][0] = (float)(it % 7 + rank); /* the data differs every call */
    if (rc == 0) rc = one_call(c, o, rank, send[k], recv[k], n, which);
  }
  double t = (now_s() - t0) / o->iters;
  if (rc) fprintf(stderr, "rank %d: %s\n", rank, rc < 0 && which ? "a peer stopped answering"
                                                              : coll_strerror(rc));
  return rc ? -1 : t;
}

/* Runs one rank; returns its seconds per call (negative on failure). */
static double rank_main(int rank, const opts_t *o, const char *key) {
  if (!o->unpinned) pin_rank(rank);
  coll_comm_config_t cfg = {.rank = rank, .size = o->P, .job_key = key, .timeout_s = 30};
  coll_comm_t *c;
  int rc = coll_comm_create(&cfg, &c);
  if (rc) {
    fprintf(stderr, "rank %d: create: %s\n", rank, coll_strerror(rc));
    return -1;
  }
  if (o->algo) coll_set_algorithm(c, o->kind, o->algo);
  size_t n = o->bytes / 4;
  int wide = o->kind == COLL_GATHER || o->kind == COLL_ALLGATHER;
  size_t rbytes = n * 4 * (wide ? (size_t)o->P : 1);
  float *send[64], *recv[64];
  for (int k = 0; k < o->nbuf; k++) {
    send[k] = buf_alloc(c, o, n * 4 + 64);
    recv[k] = buf_alloc(c, o, rbytes + 64);
    if (!send[k] || !recv[k]) return -1;
    for (size_t i = 0; i < n; i++) send[k][i] = (float)((i % 251) + rank);
  }
  coll_args_t bar = {.kind = COLL_BARRIER, .dtype = COLL_FLOAT32};
  double t = 0;
  /* -F: R times, the library's loop, then the kernel's in each schedule */
  for (int rep = 0; rep < o->floor_reps && t >= 0; rep++)
    for (int which = 0; which <= FLOOR_SCHEDULES && t >= 0; which++)
      t = floor_times[which][rep] = timed_loop(c, o, rank, send, recv, n, which);
  if (o->floor_reps == 0) t = timed_loop(c, o, rank, send, recv, n, 0);
  int total = o->warm + o->iters;
  rc = t < 0;
  if (rc == 0 && o->kind == COLL_ALLREDUCE) { /* last call: element 1 is sum over ranks of 1+r */
    int k = (total - 1) % o->nbuf;
    float want = (float)o->P + (float)(o->P * (o->P - 1) / 2);
    if (recv[k][n > 1 ? 1 : 0] != want && n > 1) {
      fprintf(stderr, "rank %d: wrong result %g, want %g\n", rank, recv[k][1], want);
      rc = -1;
    }
  }
  coll_run(c, &bar);
  coll_comm_free(c);
  return rc ? -1 : t;
}

int main(int argc, char **argv) {
  opts_t o = {.P = 2, .iters = 0, .warm = -1, .nbuf = 16, .bytes = 65536, .kind = COLL_ALLREDUCE};
  int ch;
  while ((ch = getopt(argc, argv, "n:c:s:i:w:b:a:zuF:")) != -1) {
    switch (ch) {
    case 'n': o.P = atoi(optarg); break;
    case 'c': o.kind = parse_kind(optarg); break;
    case 's': o.bytes = strtoull(optarg, NULL, 0); break;
    case 'i': o.iters = atoi(optarg); break;
    case 'w': o.warm = atoi(optarg); break;
    case 'b': o.nbuf = atoi(optarg); break;
    case 'a': o.algo = optarg; break;
    case 'z': o.zc = 1; break;
    case 'u': o.unpinned = 1; break;
    case 'F': o.floor_reps = atoi(optarg); break;
    default: return 2;
    }
  }
  if (o.nbuf < 1 || o.nbuf > 64 || o.P < 1 || o.P > 256 || o.floor_reps > MAX_REPS) return 2;
  if (o.floor_reps > 0 && ((o.kind != COLL_ALLREDUCE && o.kind != COLL_GATHER) || o.zc)) {
    fprintf(stderr, "coll_bench: -F compares allreduce or gather of private buffers\n");
    return 2;
  }
  if (o.floor_reps > 0) {
    floor_shared = mmap(NULL, staged_floor_bytes(o.P), PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (floor_shared == MAP_FAILED) return 1;
  }
  if (o.iters <= 0) o.iters = o.bytes <= 8192 ? 10000 : 200;
  if (o.warm < 0) o.warm = o.iters / 10;
  char key[64];
  snprintf(key, sizeof key, "coll_bench.%d", (int)getpid());
  size_t per_rank = sizeof floor_times / sizeof(double);
  double *times = mmap(NULL, sizeof(double) * (size_t)o.P * (1 + per_rank),
                       PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  double *series = times + o.P; /* -F: every rank's floor_times */
  for (int r = 1; r < o.P; r++)
    if (fork() == 0) {
      times[r] = rank_main(r, &o, key);
      memcpy(series + (size_t)r * per_rank, floor_times, sizeof floor_times);
      _exit(0);
    }
  times[0] = rank_main(0, &o, key);
  memcpy(series, floor_times, sizeof floor_times);
  int bad = 0;
  while (wait(NULL) > 0) {}
  double worst = 0;
  for (int r = 0; r < o.P; r++) {
    if (times[r] < 0) bad = 1;
    if (times[r] > worst) worst = times[r];
  }
  if (bad) return 1;
  if (o.floor_reps > 0) { /* per rep the slower rank, then the median over reps */
    double med[1 + FLOOR_SCHEDULES];
    for (int w = 0; w <= FLOOR_SCHEDULES; w++) {
      double v[MAX_REPS];
      for (int k = 0; k < o.floor_reps; k++) {
        v[k] = 0;
        for (int r = 0; r < o.P; r++) {
          double x = series[(size_t)r * per_rank + (size_t)w * MAX_REPS + (size_t)k];
          if (x > v[k]) v[k] = x;
        }
      }
      qsort(v, (size_t)o.floor_reps, sizeof v[0], cmp_double);
      med[w] = v[o.floor_reps / 2];
    }
    printf("%s %zu B x %d ranks, medians of %d: library %.2f us; bare kernel",
           coll_kind_name(o.kind), o.bytes, o.P, o.floor_reps, med[0] * 1e6);
    for (int w = 1; w <= FLOOR_SCHEDULES; w++)
      printf(" %s %.2f us (%.2fx)", floor_names[o.kind == COLL_GATHER][w - 1], med[w] * 1e6,
             med[0] / med[w]);
    printf("\n");
    return 0;
  }
  printf("%s %zu B x %d ranks%s: %.2f us\n", coll_kind_name(o.kind), o.bytes, o.P,
         o.zc ? " (arena)" : "", worst * 1e6);
  return 0;
}
