/*
 * test_net_eager.c - the bridge's eager path for small messages (net_ring.c's small allgather,
 * what every call's meeting across nodes uses): steps injected whole (a few dozen bytes) or
 * written (over the inject size), no credits, the pool's two areas reused call after call.
 * Each member a process in its own network namespace (tests/c/netns.h), tcp;ofi_rxm.
 *
 *  - 2 and 3 nodes, 10000 (2 nodes) or 3000 (3 nodes) allgathers back to back, the size
 *    changing from call to call (injected, written, a whole block; one member's own block now and
 *    then only in part, as a bcast's non-root sends), with one member sleeping at
 *    random so that the others run ahead of it, and an allreduce around the ring every 500
 *    calls (its notes among the small ones'): every byte of every result checked;
 *  - a member that dies in the middle of the calls: every other member's wait ends with
 *    COLL_EPEERLOST (watching a connection the dead one held, as the layer across nodes does),
 *    or, watching none, with an error within its time limit: never a hang.
 * Without root (no namespaces) or libfabric's tcp provider the cases are skips.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "coll.h"
#include "net.h"
#include "net_ring.h"

#define HARNESS_KEY_PREFIX "hbne"
#define MAX_RANKS 3
#define HARNESS_NAME_WIDTH 52
#include "harness.h"
#include "netns.h"
#include "net_members.h"

#define POOL (1 << 20)
#define BLOCK 1056 /* a meeting's block (hier.c) */
#define SLOW 1     /* the member that sleeps now and then */

/* Byte i of member m's block in call c. */
static uint8_t value(uint32_t c, int m, size_t i) { return (uint8_t)(c * 131u + (uint32_t)m * 37u + i * 7u); }

/* The bytes of each block that matter in call c: a step injected whole, one written (over the
 * inject size of 64 bytes here), a whole block, and one byte. */
static size_t used_of(uint32_t c) {
  static const size_t used[] = {40, 200, BLOCK, 1, 64};
  return used[c % (sizeof used / sizeof used[0])];
}

/* Of those, the bytes of member m's own block that matter (the others need no more of it): all,
 * or every third call on member 1 a part only, as a bcast's non-root sends its head alone. */
static size_t own_of(uint32_t c, int m) { return m == 1 && c % 3 == 0 ? (used_of(c) + 1) / 2 : used_of(c); }

static int calls(const members_t *ms, int me, int fd) {
  int n = ms->n;
  uint32_t total = *(const uint32_t *)ms->arg;
  char err[256] = "";
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int rc = join(me, n, fd, ms->ns, POOL, &net, &ring);
  if (rc) return rc;
  uint8_t *buf = malloc((size_t)n * BLOCK);
  unsigned seed = 1234u + (unsigned)me;
  int bad = 0;
  for (uint32_t c = 0; c < total && rc == 0 && bad == 0; c++) {
    size_t used = used_of(c);
    memset(buf, 0xee, (size_t)n * BLOCK);
    for (size_t i = 0; i < used; i++) buf[(size_t)me * BLOCK + i] = value(c, me, i);
    if (me == SLOW && rand_r(&seed) % 16 == 0) usleep((useconds_t)(rand_r(&seed) % 300));
    rc = coll__net_ring_allgather_used(ring, buf, BLOCK, used, own_of(c, me), 30, err, sizeof err);
    for (int m = 0; rc == 0 && m < n; m++)
      for (size_t i = 0; i < own_of(c, m); i++)
        if (buf[(size_t)m * BLOCK + i] != value(c, m, i)) {
          fprintf(stderr, "member %d: call %u: member %d's byte %zu wrong\n", me, (unsigned)c, m, i);
          bad = 1;
          break;
        }
    if (rc == 0 && c % 500 == 499) { /* the ring's own notes among the small allgather's */
      int32_t x[3] = {me, (int32_t)c, 1};
      rc = coll__net_ring_allreduce(ring, COLL_INT32, COLL_SUM, x, 3, 30, err, sizeof err);
      if (rc == 0 && (x[0] != n * (n - 1) / 2 || x[1] != n * (int32_t)c || x[2] != n))
        fprintf(stderr, "member %d: call %u: the ring's allreduce is wrong\n", me, (unsigned)c), bad = 1;
    }
  }
  free(buf);
  if (rc) fprintf(stderr, "member %d: %d %s\n", me, rc, err);
  char done = 'a'; /* every member finished before any endpoint closes */
  if (write(fd, &done, 1) != 1 || read(fd, &done, 1) != 1) return 16;
  coll__net_ring_free(ring);
  coll__net_close(net);
  return rc || bad ? 18 : 0;
}

static void run_calls(const char *name, int n, uint32_t total) {
  netns_t ns;
  if (netns_up(&ns, n) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  double t0 = now_s();
  members_t ms = {.n = n, .ns = &ns, .alarm_s = 300, .arg = &total};
  int ok = members_start(&ms, calls);
  char done, why[160] = "";
  for (int m = 0; m < n; m++)
    if (read(ms.fds[m][0], &done, 1) != 1 && ok) snprintf(why, sizeof why, "member %d stopped early", m), ok = 0;
  done = 'd';
  for (int m = 0; m < n; m++) (void)!write(ms.fds[m][0], &done, 1);
  ok &= members_reap(&ms, why, sizeof why);
  record(ok, name, n, now_s() - t0, ok ? NULL : why);
  netns_down(&ns);
}

/* Member SLOW dies after 300 calls, unannounced; the others call on. Watching (*arg, watch_fd >= 0:
 * a link whose other end the dead one held) they must end with COLL_EPEERLOST and no time limit;
 * else with an error within their 5 s limit. */
static int dies(const members_t *ms, int me, int fd) {
  int n = ms->n, watch_fd = *(const int *)ms->arg && me != SLOW ? ms->links[me][0] : -1;
  for (int o = 0; o < n; o++) { /* links[m]: m's end closes when SLOW is gone; SLOW keeps every */
    if (me != SLOW || o == SLOW) close(ms->links[o][1]); /* other end, the others their own */
    if (o != me) close(ms->links[o][0]);
  }
  char err[256] = "";
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int rc = join(me, n, fd, ms->ns, POOL, &net, &ring);
  if (rc) _exit(rc);
  if (watch_fd >= 0) coll__net_watch(net, watch_fd, "the dead node");
  static uint8_t buf[MAX_RANKS * BLOCK];
  double t0 = 0;
  for (uint32_t c = 0; rc == 0 && c < 100000; c++) {
    if (me == SLOW && c == 300) _exit(0); /* the endpoint goes with the process */
    if (c == 300) t0 = now_s();
    rc = coll__net_ring_allgather_used(ring, buf, BLOCK, used_of(c), used_of(c), watch_fd >= 0 ? 0 : 5, err,
                                       sizeof err);
  }
  double dt = now_s() - t0;
  if (getenv("HBMCOLL_TEST_VERBOSE")) fprintf(stderr, "member %d: %d after %.1f s: %s\n", me, rc, dt, err);
  if (watch_fd >= 0) return rc == COLL_EPEERLOST && strstr(err, "the dead node") && dt < 5 ? 0 : 19;
  return rc != 0 && err[0] && dt < 10 ? 0 : 19;
}

static void run_dies(const char *name, int n, int watched) {
  netns_t ns;
  if (netns_up(&ns, n) != 0) {
    printf("skip %-*s (%s)\n", HARNESS_NAME_WIDTH, name, ns.why);
    return;
  }
  double t0 = now_s();
  members_t ms = {.n = n, .ns = &ns, .alarm_s = 60, .nlinks = n, .arg = &watched};
  (void)members_start(&ms, dies); /* a failed swap shows as the survivors' exit status */
  int ok = members_reap(&ms, NULL, 0);
  record(ok, name, n, now_s() - t0, ok ? NULL : "a survivor hung or saw the wrong error");
  netns_down(&ns);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  if (CASE("eager: 2 nodes")) run_calls("eager: 2 nodes, 10000 calls, one member late", 2, 10000);
  if (CASE("eager: 3 nodes")) run_calls("eager: 3 nodes, 3000 calls, one member late", 3, 3000);
  if (CASE("eager: a member dies")) {
    run_dies("eager: a member dies, 2 nodes, watched: peer lost", 2, 1);
    run_dies("eager: a member dies, 3 nodes, watched: peer lost", 3, 1);
    run_dies("eager: a member dies, 3 nodes: an error in time", 3, 0);
  }
  return harness_finish();
}
