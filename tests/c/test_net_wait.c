/*
 * test_net_wait.c - the bridge's waits sleep in the kernel, and still end when they should
 * (libcoll/src/net_wait.c): two members of a ring on emulated nodes (tests/c/netns.h), tcp;ofi_rxm.
 *
 *  - a member that waits for a neighbour 300 ms late uses well under half of the wait's wall time
 *    in CPU (CLOCK_PROCESS_CPUTIME_ID): it slept. Once the connection is up, the neighbour's bytes
 *    end one of its blocks through the CQ's fd (coll__net_wait_counts), not the clock: bytes
 *    arriving on the provider's sockets do stir the fd although tcp has manual progress, which
 *    net_wait.c relies on. The same with 12 MiB, whose writes outrun the socket buffers. At first
 *    contact (the connection made by the late write itself) only the sleeping is checked: rxm's
 *    connection setup does not stir the fd in libfabric 1.17 (measured here: such a wait ends at
 *    its block's bound, a few tens of ms late, once);
 *  - a wait on a silent neighbour ends promptly when the watched connection closes (a lost node:
 *    COLL_EPEERLOST), when the interrupt callback says so (COLL_EINTERRUPTED), and at its deadline
 *    (-ETIMEDOUT), sleeping meanwhile.
 * The bounds are generous (properties, not speeds): CPU under half the wall time, an end within
 * half a second of its cause, a deadline of 1 s met between 1 and 1.5 s.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "net.h"
#include "net_ring.h"

#define HARNESS_KEY_PREFIX "hbnw"
#define MAX_RANKS 2
#define HARNESS_NAME_WIDTH 56
#include "harness.h"
#include "netns.h"
#include "net_members.h"

#define POOL (1 << 20)
#define LATE_S 0.3
#define BIG ((size_t)3 << 20) /* floats: 12 MiB, several slots a segment */

enum { LATE_COLD, LATE, LATE_BIG, WATCH, INTERRUPT, DEADLINE };

typedef struct {
  double cause_at; /* when member 1 wrote, or closed the watched connection */
  double ended_at, wall, cpu;
  uint64_t blocks, woken; /* member 0's blocks during the wait, and those the CQ's fd ended */
  int rc;
  char err[256], line[320];
} shared_t;

static shared_t *shared; /* MAP_SHARED, made before the forks */

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double interrupt_at;
static int interrupt_late(void *arg) { return (void)arg, now_s() > interrupt_at; }

static int member(const members_t *ms, int me, int fd) {
  int kind = *(const int *)ms->arg, link = ms->links[0][me]; /* in WATCH member 1 shuts its end down */
  close(ms->links[0][1 - me]);
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int rc = join(me, ms->n, fd, ms->ns, POOL, &net, &ring);
  if (rc) return rc;
  size_t count = kind == LATE_BIG ? BIG : 2;
  float *buf = malloc(count * sizeof *buf);
  for (size_t i = 0; i < count; i++) buf[i] = (float)(me + 1);
  char err[256] = "", done;
  if (kind != LATE_COLD) { /* connections up first: their setup does not stir the CQ's fd (see the top) */
    float w[2] = {1, 1};
    if ((rc = coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_SUM, w, 2, 60, err, sizeof err)) != 0)
      return fprintf(stderr, "member %d: the first allreduce: %d %s\n", me, rc, err), 15;
  }
  if (me == 1) {
    int late = kind == LATE_COLD || kind == LATE || kind == LATE_BIG;
    if (late || kind == WATCH) usleep((useconds_t)(LATE_S * 1e6));
    shared->cause_at = now_s();
    if (kind == WATCH) shutdown(link, SHUT_RDWR); /* the connection goes; the process stays */
    if (late) rc = coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_SUM, buf, count, 60, err, sizeof err);
    if (rc) fprintf(stderr, "member 1: %d %s\n", rc, err);
  } else {
    snprintf(shared->line, sizeof shared->line, "%s", coll__net_describe(net));
    if (kind == WATCH) coll__net_watch(net, link, "node 1");
    if (kind == INTERRUPT) interrupt_at = now_s() + LATE_S, coll__net_set_interrupt(net, interrupt_late, NULL);
    uint64_t b0, w0, b1, w1;
    coll__net_wait_counts(net, &b0, &w0);
    double t0 = now_s(), c0 = cpu_s();
    rc = coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_SUM, buf, count, kind == DEADLINE ? 1.0 : 0, err,
                                  sizeof err);
    shared->ended_at = now_s();
    shared->wall = shared->ended_at - t0, shared->cpu = cpu_s() - c0, shared->rc = rc;
    coll__net_wait_counts(net, &b1, &w1);
    shared->blocks = b1 - b0, shared->woken = w1 - w0;
    snprintf(shared->err, sizeof shared->err, "%s", err);
    if (rc == 0 && (buf[0] != 3.0f || buf[count - 1] != 3.0f)) shared->rc = -EIO;
    rc = 0;
  }
  /* both through before either endpoint closes (a closing one breaks the other's last writes) */
  if (write(fd, "a", 1) != 1 || read(fd, &done, 1) != 1) rc = 17;
  free(buf);
  coll__net_ring_free(ring);
  coll__net_close(net);
  return rc;
}

static void run(const char *name, int kind) {
  netns_t ns;
  if (netns_up(&ns, 2) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  memset(shared, 0, sizeof *shared);
  double t0 = now_s();
  members_t ms = {.n = 2, .ns = &ns, .alarm_s = 60, .nlinks = 1, .arg = &kind};
  int ok = members_start(&ms, member);
  char through;
  for (int m = 0; m < 2; m++) ok &= read(ms.fds[m][0], &through, 1) == 1; /* member 0's wait is over first */
  for (int m = 0; m < 2; m++) (void)!write(ms.fds[m][0], "d", 1);
  ok &= members_reap(&ms, NULL, 0);
  int st0 = ms.status[0], st1 = ms.status[1];
  shared_t *s = shared;
  double after = s->ended_at - s->cause_at;
  char why[512] = "";
  int want = kind == WATCH ? COLL_EPEERLOST : kind == INTERRUPT ? COLL_EINTERRUPTED : kind == DEADLINE ? -ETIMEDOUT : 0;
  if (!ok)
    snprintf(why, sizeof why, "a member failed (statuses %d, %d)", st0, st1);
  else if (s->rc != want)
    snprintf(why, sizeof why, "the wait returned %d (%s), not %d", s->rc, s->err, want);
  else if (strstr(s->line, "waits block") == NULL)
    snprintf(why, sizeof why, "the bridge does not block its waits: %s", s->line);
  else if (kind != LATE_BIG && s->cpu >= 0.5 * s->wall)
    snprintf(why, sizeof why, "the wait used %.3f s of CPU in %.3f s: it did not sleep", s->cpu, s->wall);
  else if ((kind == LATE || kind == LATE_BIG) && s->woken == 0)
    snprintf(why, sizeof why, "none of the wait's %llu blocks was ended by the CQ's fd: the bytes did not wake it",
             (unsigned long long)s->blocks);
  else if (kind != DEADLINE && after > 0.5)
    snprintf(why, sizeof why, "the wait ended %.3f s after its cause", after);
  else if (kind == DEADLINE && (s->wall < 1.0 || s->wall > 1.5))
    snprintf(why, sizeof why, "the 1 s deadline ended the wait after %.3f s", s->wall);
  if (getenv("HBMCOLL_TEST_VERBOSE") || why[0])
    fprintf(stderr, "  %s; waited %.3f s, CPU %.3f s, ended %.4f s after its cause, rc %d, %llu blocks, %llu woken "
            "by the CQ's fd\n", s->line, s->wall, s->cpu, after, s->rc, (unsigned long long)s->blocks,
            (unsigned long long)s->woken);
  record(why[0] == 0, name, 2, now_s() - t0, why[0] ? why : NULL);
  netns_down(&ns);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) return 1;
  if (CASE("wait: first contact 300 ms late")) run("wait: first contact 300 ms late: it sleeps", LATE_COLD);
  if (CASE("wait: a neighbour 300 ms late")) run("wait: a neighbour 300 ms late, 8 B: its bytes wake it", LATE);
  if (CASE("wait: a neighbour 300 ms late, 12 MiB")) run("wait: a neighbour 300 ms late, 12 MiB", LATE_BIG);
  if (CASE("wait: the watched connection closes")) run("wait: the watched connection closes: lost", WATCH);
  if (CASE("wait: the interrupt callback")) run("wait: the interrupt callback ends it", INTERRUPT);
  if (CASE("wait: the deadline")) run("wait: the deadline ends it", DEADLINE);
  return harness_finish();
}
