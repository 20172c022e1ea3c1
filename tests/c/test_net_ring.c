/*
 * test_net_ring.c - allreduce, allgather and reduce-scatter between emulated nodes around the bridge's ring
 * (libcoll/src/net_ring.c): each member a process in its own network namespace
 * (tests/c/netns.h), tcp;ofi_rxm over the veths, cards swapped through the parent.
 *
 *  - 2 and 3 nodes; float32, int32, float64 and bfloat16; SUM, PROD, MIN, MAX; counts 0,
 *    1, n - 1, n*k + 1, a slot's worth and one more, and 3 MiB (more than one slot per
 *    segment, so chunks pipeline; with 2 nodes the counts up to a slot take the exchange,
 *    bfloat16 and the larger counts the ring); MAX also over +0, -0 and NaN;
 *    results against a reference computed from every member's input;
 *  - every member ends with the same bits, also for sums of floats that are not exact
 *    (each member reports a checksum of its result, the parent compares them);
 *  - several collectives in a row on one ring (transfer numbers carry on);
 *  - allgather of blocks from 0 bytes to 3 MiB after the allreduces, each block checked;
 *  - reduce-scatter alone, each member's own segment checked;
 *  - shifts by every distance, each followed by an allreduce around the ring;
 *  - with 1% of the frames dropped, the same.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "net.h"
#include "net_ring.h"

#define HARNESS_KEY_PREFIX "hbnr"
#define MAX_RANKS 5
#define HARNESS_NAME_WIDTH 48
#include "harness.h"
#include "netns.h"
#include "net_members.h"

#define POOL (1 << 20)

typedef struct {
  coll_dtype_t dtype;
  coll_op_t op;
} ring_kind_t;

static const ring_kind_t kinds[] = {
    {COLL_FLOAT32, COLL_SUM}, {COLL_INT32, COLL_SUM},     {COLL_FLOAT64, COLL_MAX},
    {COLL_INT32, COLL_MIN},   {COLL_FLOAT32, COLL_PROD},  {COLL_BFLOAT16, COLL_SUM},
};

/* Member m's element i, as a double: small integers (exact in every dtype here, and for
 * PROD near 1) so the reference is exact; `inexact` adds fractions that no sum keeps, and for
 * MIN and MAX mixes +0, -0 and NaN between the members (which one a fold keeps is a matter of
 * order: every member must still end with the same bits). */
static double input(int m, size_t i, coll_op_t op, int inexact) {
  if (op == COLL_PROD) return (i + (size_t)m) % 3 == 0 ? 2.0 : 1.0;
  if (inexact && (op == COLL_MIN || op == COLL_MAX)) {
    size_t k = (i + (size_t)m) % 4;
    return k == 0 ? 0.0 : k == 1 ? -0.0 : k == 2 && i % 5 == 0 ? NAN : (double)(i % 7);
  }
  double v = (double)((i * 7 + (size_t)m * 13) % 61) - 30.0;
  return inexact ? v / 3.0 + 1e-7 * (double)m : v;
}

static void store(coll_dtype_t t, void *buf, size_t i, double v) {
  if (t == COLL_FLOAT32) ((float *)buf)[i] = (float)v;
  else if (t == COLL_FLOAT64) ((double *)buf)[i] = v;
  else if (t == COLL_INT32) ((int32_t *)buf)[i] = (int32_t)v;
  else { /* bfloat16: the top half of the float, exact for these small integers */
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)buf)[i] = (uint16_t)(u >> 16);
  }
}

static double load(coll_dtype_t t, const void *buf, size_t i) {
  if (t == COLL_FLOAT32) return ((const float *)buf)[i];
  if (t == COLL_FLOAT64) return ((const double *)buf)[i];
  if (t == COLL_INT32) return ((const int32_t *)buf)[i];
  uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static double fold(coll_op_t op, double a, double b) {
  return op == COLL_SUM ? a + b : op == COLL_PROD ? a * b : op == COLL_MIN ? fmin(a, b) : fmax(a, b);
}

#define NCOUNTS 7
/* Cases of a kind: every count, twice for float32 SUM and float64 MAX (exact inputs, then
 * inexact ones). */
static int kind_runs(const ring_kind_t *k) {
  return (k->dtype == COLL_FLOAT32 && k->op == COLL_SUM) || (k->dtype == COLL_FLOAT64 && k->op == COLL_MAX) ? 2 : 1;
}

static int total_cases(void) {
  int total = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) total += NCOUNTS * kind_runs(&kinds[k]);
  return total;
}

static uint64_t checksum(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

/* Allgather of blocks from 0 bytes to several chunks: block m must hold member m's bytes. */
static int allgather_cases(int me, int n, coll__net_ring_t *ring) {
  size_t blocks[] = {0, 1, 1000, (3u << 20) + 5};
  char err[256] = "";
  int bad = 0;
  for (size_t b = 0; b < sizeof blocks / sizeof blocks[0]; b++) {
    size_t len = blocks[b];
    uint8_t *buf = malloc(len * (size_t)n + 1);
    memset(buf, 0xee, len * (size_t)n);
    for (size_t i = 0; i < len; i++) buf[(size_t)me * len + i] = (uint8_t)(i * 7 + (size_t)me * 31);
    int rc = coll__net_ring_allgather(ring, buf, len, 60, err, sizeof err);
    if (rc) fprintf(stderr, "member %d: allgather of %zu: %d %s\n", me, len, rc, err), bad++;
    for (size_t i = 0; rc == 0 && i < len * (size_t)n; i++)
      if (buf[i] != (uint8_t)((i % len) * 7 + (i / len) * 31)) {
        fprintf(stderr, "member %d: allgather of %zu: byte %zu wrong\n", me, len, i);
        bad++;
        break;
      }
    free(buf);
  }
  return bad;
}

/* Reduce-scatter alone: member m's own segment (the first count % n one longer) must be the
 * reduction over all members; counts up to several chunks a segment. */
static int reduce_scatter_cases(int me, int n, coll__net_ring_t *ring) {
  size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n * 1000 + 1, (3u << 20) + 7};
  ring_kind_t ks[] = {{COLL_FLOAT32, COLL_SUM}, {COLL_INT32, COLL_MAX}};
  char err[256] = "";
  int bad = 0;
  for (size_t k = 0; k < 2; k++)
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
      coll_dtype_t t = ks[k].dtype;
      coll_op_t op = ks[k].op;
      size_t cnt = counts[c], base = cnt / (size_t)n, extra = cnt % (size_t)n, m = (size_t)me;
      uint8_t *buf = malloc(cnt * coll_dtype_size(t) + 1);
      for (size_t i = 0; i < cnt; i++) store(t, buf, i, input(me, i, op, 0));
      int rc = coll__net_ring_reduce_scatter(ring, t, op, buf, cnt, 60, err, sizeof err);
      if (rc) fprintf(stderr, "member %d: reduce_scatter of %zu: %d %s\n", me, cnt, rc, err), bad++;
      size_t from = m * base + (m < extra ? m : extra), to = from + base + (m < extra);
      for (size_t i = from; rc == 0 && i < to; i++) {
        double want = input(0, i, op, 0);
        for (int q = 1; q < n; q++) want = fold(op, want, input(q, i, op, 0));
        if (load(t, buf, i) != want) {
          fprintf(stderr, "member %d: reduce_scatter of %zu: [%zu] = %g, want %g\n", me, cnt, i, load(t, buf, i), want);
          bad++;
          break;
        }
      }
      free(buf);
    }
  return bad;
}

/* 1 (and a line) when some got[i] is not (uint8_t)(i * step + base). */
static int pattern_wrong(int me, const char *what, int k, const uint8_t *got, size_t len, size_t step, size_t base) {
  for (size_t i = 0; i < len; i++)
    if (got[i] != (uint8_t)(i * step + base)) {
      fprintf(stderr, "member %d: %s %d of %zu: byte %zu wrong\n", me, what, k, len, i);
      return 1;
    }
  return 0;
}

/* An allreduce around the ring after another kind of run (what, k): 1 when it fails or is wrong. */
static int allreduce_after(int me, int n, coll__net_ring_t *ring, const char *what, int k) {
  char err[256] = "";
  int32_t x[1000];
  for (int i = 0; i < 1000; i++) x[i] = me + i;
  int rc = coll__net_ring_allreduce(ring, COLL_INT32, COLL_SUM, x, 1000, 60, err, sizeof err);
  if (rc == 0 && x[999] == n * 999 + n * (n - 1) / 2) return 0;
  fprintf(stderr, "member %d: allreduce after %s %d: %d %s\n", me, what, k, rc, err);
  return 1;
}

/* Shifts by every distance (the pairwise steps of an alltoall), sizes up to several chunks,
 * then an allreduce around the ring again: member me - j's bytes must arrive whole, and the
 * neighbours' change each way must not let a write into a slot not yet read. */
static int shift_cases(int me, int n, coll__net_ring_t *ring) {
  size_t sizes[] = {1, 1000, (3u << 20) + 3};
  char err[256] = "";
  int bad = 0;
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (int j = 1; j < n; j++) {
      size_t len = sizes[z];
      int from = (me + n - j) % n;
      uint8_t *src = malloc(len), *dst = malloc(len);
      for (size_t i = 0; i < len; i++) src[i] = (uint8_t)(i * 5 + (size_t)me * 37 + (size_t)j);
      int rc = coll__net_ring_shift(ring, j, src, dst, len, 60, err, sizeof err);
      if (rc) fprintf(stderr, "member %d: shift %d of %zu: %d %s\n", me, j, len, rc, err), bad++;
      if (rc == 0) bad += pattern_wrong(me, "shift", j, dst, len, 5, (size_t)from * 37 + (size_t)j);
      free(src), free(dst);
      bad += allreduce_after(me, n, ring, "shift", j);
    }
  return bad;
}

/* bcast from every member, sizes up to several chunks, each followed by an allreduce: the root's
 * bytes must arrive whole, and the credits of the chain (the last member's empty notes) must leave
 * the ring as the next run expects it. */
static int bcast_cases(int me, int n, coll__net_ring_t *ring) {
  size_t sizes[] = {1, 1000, (3u << 20) + 11};
  char err[256] = "";
  int bad = 0;
  for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++)
    for (int root = 0; root < n; root++) {
      size_t len = sizes[z];
      uint8_t *buf = malloc(len);
      for (size_t i = 0; i < len; i++) buf[i] = me == root ? (uint8_t)(i * 3 + (size_t)root * 41) : 0xee;
      int rc = coll__net_ring_bcast(ring, root, buf, len, 60, err, sizeof err);
      if (rc) fprintf(stderr, "member %d: bcast from %d of %zu: %d %s\n", me, root, len, rc, err), bad++;
      if (rc == 0) bad += pattern_wrong(me, "bcast from", root, buf, len, 3, (size_t)root * 41);
      free(buf);
      bad += allreduce_after(me, n, ring, "bcast from", root);
    }
  return bad;
}

static int member(const members_t *ms, int me, int fd) {
  int n = ms->n;
  char err[256] = "";
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int rc = join(me, n, fd, ms->ns, POOL, &net, &ring);
  if (rc) return rc;
  /* the last two: a slot's worth of the dtype and one more (2 members: the exchange's largest
   * message, then the ring) */
  size_t counts[NCOUNTS] = {0, 1, (size_t)n - 1, (size_t)n * 1000 + 1, 3u << 20, 0, 0};
  int bad = 0;
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    for (size_t c = 0; c < NCOUNTS; c++) {
      for (int inexact = 0; inexact < kind_runs(&kinds[k]); inexact++) {
        coll_dtype_t t = kinds[k].dtype;
        coll_op_t op = kinds[k].op;
        size_t es = coll_dtype_size(t), slot = coll__net_ring_slot_bytes(ring) / es;
        size_t cnt = c < 5 ? counts[c] : slot + (c - 5);
        uint8_t *buf = malloc(cnt * es + 1);
        for (size_t i = 0; i < cnt; i++) store(t, buf, i, input(me, i, op, inexact));
        rc = coll__net_ring_allreduce(ring, t, op, buf, cnt, 60, err, sizeof err);
        if (rc) {
          fprintf(stderr, "member %d: %s %s count %zu: %d %s\n", me, coll_dtype_name(t), coll_op_name(op),
                  cnt, rc, err);
          return 15;
        }
        for (size_t i = 0; !inexact && i < cnt; i++) {
          double want = input(0, i, op, 0);
          for (int m = 1; m < n; m++) want = fold(op, want, input(m, i, op, 0));
          if (load(t, buf, i) != want) {
            if (bad++ < 3)
              fprintf(stderr, "member %d: %s %s count %zu: [%zu] = %g, want %g\n", me, coll_dtype_name(t),
                      coll_op_name(op), cnt, i, load(t, buf, i), want);
          }
        }
        uint64_t h = checksum(buf, cnt * es);
        free(buf);
        if (write(fd, &h, sizeof h) != sizeof h) return 16;
      }
    }
  }
  bad += allgather_cases(me, n, ring);
  bad += reduce_scatter_cases(me, n, ring);
  bad += shift_cases(me, n, ring);
  bad += bcast_cases(me, n, ring);
  coll__net_ring_free(ring);
  char done = 'a'; /* my allgathers are over; the parent says when everyone's are */
  if (write(fd, &done, 1) != 1) return 16;
  if (read(fd, &done, 1) != 1) return 17; /* every member finished before any endpoint closes */
  coll__net_close(net);
  return bad ? 18 : 0;
}

/* Member 1 dies once the ring is made; member 0's allreduce must end with an error, not
 * hang: within its 5 s timeout, or, watching its link to member 1 (*arg, watch_fd >= 0) and
 * with no time limit, as soon as that connection closes, as COLL_EPEERLOST. */
static int member_dies(const members_t *ms, int me, int fd) {
  const int *link = ms->links[0]; /* member 0's end closes when member 1 is gone */
  int watch_fd = *(const int *)ms->arg && me == 0 ? link[0] : -1;
  close(link[1 - me]);
  char err[256] = "";
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int rc = join(me, ms->n, fd, ms->ns, POOL, &net, &ring);
  if (rc || me == 1) _exit(rc); /* the endpoint goes with the process, unannounced */
  usleep(200000);
  static float buf[1 << 20];
  if (watch_fd >= 0) coll__net_watch(net, watch_fd, "node 1");
  double t0 = now_s();
  rc = coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_SUM, buf, 1 << 20, watch_fd >= 0 ? 0 : 5, err,
                                sizeof err);
  double dt = now_s() - t0;
  if (getenv("HBMCOLL_TEST_VERBOSE")) fprintf(stderr, "member 0: %d after %.1f s: %s\n", rc, dt, err);
  if (watch_fd >= 0) return rc == COLL_EPEERLOST && strstr(err, "node 1") && dt < 5 ? 0 : 19;
  return rc != 0 && err[0] && dt < 10 ? 0 : 19;
}

static void run_dead(const char *name, int watched) {
  netns_t ns;
  if (netns_up(&ns, 2) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  double t0 = now_s();
  members_t ms = {.n = 2, .ns = &ns, .alarm_s = 60, .nlinks = 1, .arg = &watched};
  (void)members_start(&ms, member_dies); /* a failed swap shows as the survivor's exit status */
  (void)members_reap(&ms, NULL, 0); /* the survivor's status decides: member 1 dies */
  int ok = WIFEXITED(ms.status[0]) && WEXITSTATUS(ms.status[0]) == 0;
  record(ok, name, 2, now_s() - t0, ok ? NULL : "the survivor hung or saw no error");
  netns_down(&ns);
}

static void run_ring(const char *name, int n, int loss_pct) {
  netns_t ns;
  if (netns_up(&ns, n) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  if (loss_pct && netns_loss(&ns, loss_pct) != 0) {
    record(0, name, n, 0, "nft could not add the loss rule");
    netns_down(&ns);
    return;
  }
  double t0 = now_s();
  members_t ms = {.n = n, .ns = &ns, .alarm_s = 300};
  int ok = members_start(&ms, member);
  char why[160] = "";
  for (int c = 0; ok && c < total_cases(); c++) { /* one checksum per case from every member */
    uint64_t h[MAX_RANKS];
    for (int m = 0; ok && m < n; m++)
      if (read(ms.fds[m][0], &h[m], 8) != 8) {
        snprintf(why, sizeof why, "member %d stopped before case %d", m, c);
        ok = 0;
      } else if (h[m] != h[0]) {
        snprintf(why, sizeof why, "members 0 and %d disagree on the bits of case %d", m, c);
        ok = 0;
      }
  }
  /* every member finished its allgathers too (a member that closed its endpoint before its
   * right neighbour's last credit reached it would break that neighbour's write) */
  char done;
  for (int m = 0; ok && m < n; m++)
    if (read(ms.fds[m][0], &done, 1) != 1) {
      snprintf(why, sizeof why, "member %d stopped before the end of its allgathers", m);
      ok = 0;
    }
  done = 'd'; /* every member finished: they may close their endpoints */
  for (int m = 0; m < n; m++) (void)!write(ms.fds[m][0], &done, 1);
  ok &= members_reap(&ms, why, sizeof why);
  record(ok, name, n, now_s() - t0, ok ? NULL : why);
  netns_down(&ns);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  if (CASE("ring: 2 nodes")) run_ring("ring: 2 nodes, every dtype x op x count, allgather, bcast", 2, 0);
  if (CASE("ring: 3 nodes")) run_ring("ring: 3 nodes, every dtype x op x count, allgather, bcast", 3, 0);
  if (CASE("ring: 5 nodes")) run_ring("ring: 5 nodes, every dtype x op x count, allgather, bcast", 5, 0);
  if (CASE("ring: 3 nodes, 1% loss")) run_ring("ring: 3 nodes, 1% of frames dropped", 3, 1);
  if (CASE("ring: a member dies")) run_dead("ring: a member dies: an error, not a hang", 0);
  if (CASE("ring: a member dies")) run_dead("ring: a member dies, watched: peer lost at once", 1);
  return harness_finish();
}
