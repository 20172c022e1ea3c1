/*
 * net_bench.c - the bridge's allreduce between nodes alone (libcoll/src/net_ring.c), one
 * member per network namespace; bench/net_bridge.py makes the namespaces and runs gloo
 * over the same links in the same run.
 *
 *   build/net_bench NS0,NS1[,...] [-i IFACE] [-s BYTES[,BYTES...]] [-t SECONDS] [-p POOL_BYTES]
 *                   [-k allreduce|allgather|bcast|pingpong]
 *
 * Forks one member per namespace (setns), swaps the endpoints' cards over socketpairs, and
 * for each size (float32 sum) runs warm-up calls and then timed calls for about -t seconds
 * (at least 5), each started together (the members agree on the count through the first
 * call). Prints "allreduce BYTES B: US us" per size: the slowest member's mean.
 * -k allgather times the ring's allgather of BYTES per member instead (what a call's meeting
 * costs between nodes); -k pingpong times one coll__net_write with its note one way (half a
 * round trip between members 0 and 1, polled without idling: the bridge's floor).
 */
#include <fcntl.h>
#include <sched.h>
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

#define MAX_MEMBERS 16

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int enter(const char *ns) {
  char path[128];
  snprintf(path, sizeof path, "/var/run/netns/%s", ns);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  int rc = fd < 0 ? -1 : setns(fd, CLONE_NEWNET);
  if (fd >= 0) close(fd);
  return rc;
}

static size_t pool_bytes = 4u << 20; /* -p: the ring's slots are a quarter each */
static const char *kind = "allreduce"; /* -k */

/* Until a note arrives, polling without idling. */
static int await_note(coll__net_t *net, char *err, size_t errlen) {
  uint32_t note;
  int rc;
  while ((rc = coll__net_poll(net, &note, err, errlen)) == 0) {
  }
  return rc < 0 ? rc : 0;
}

/* One call of the kind timed: member 0 and 1 bounce `bytes` (pingpong: 2 transfers), or the ring's. */
static int one_call(coll__net_ring_t *ring, coll__net_t *net, int me, int peer, float *buf, size_t bytes,
                    char *err, size_t errlen) {
  size_t count = bytes / 4 ? bytes / 4 : 1;
  if (!strcmp(kind, "allgather")) {
    int n = coll__net_ring_members(ring);
    static uint8_t *all;
    static size_t all_bytes;
    if (all_bytes < bytes * (size_t)n && (all = realloc(all, bytes * (size_t)n)) != NULL) all_bytes = bytes * (size_t)n;
    return all ? coll__net_ring_allgather(ring, all, bytes, 60, err, errlen) : -1;
  }
  if (!strcmp(kind, "bcast")) return coll__net_ring_bcast(ring, 0, buf, bytes, 60, err, errlen);
  if (!strcmp(kind, "pingpong") && me < 2) {
    size_t len = bytes ? bytes : 1;
    int rc = me == 1 ? await_note(net, err, errlen) : 0;
    /* a note no ring waits for (a small allgather step number never reached) */
    if (rc == 0) rc = coll__net_write(net, peer, 0, 0, len, 0x7fffffffu, NULL, err, errlen);
    if (rc == 0 && me == 0) rc = await_note(net, err, errlen);
    return rc;
  }
  if (!strcmp(kind, "pingpong")) return 0;
  return coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_SUM, buf, count, 60, err, errlen);
}

static int member(int me, int n, int fd, const char *ns, const char *iface, const size_t *sizes,
                  int nsizes, double seconds) {
  char err[256] = "";
  coll__net_t *net = NULL;
  if (enter(ns) != 0) return fprintf(stderr, "member %d: cannot enter %s\n", me, ns), 2;
  int rc = coll__net_open(iface, pool_bytes, &net, err, sizeof err);
  if (rc) return fprintf(stderr, "member %d: %s\n", me, err), 2;
  if (me == 0) fprintf(stderr, "net_bench: %s\n", coll__net_describe(net));
  uint8_t card[COLL_NET_CARD_MAX], all[MAX_MEMBERS][COLL_NET_CARD_MAX];
  uint32_t len = (uint32_t)coll__net_card(net, card), lens[MAX_MEMBERS];
  if (write(fd, &len, 4) != 4 || write(fd, card, len) != (ssize_t)len ||
      read(fd, lens, sizeof lens) != sizeof lens || read(fd, all, sizeof all) != sizeof all)
    return 3;
  int lm = (me + n - 1) % n, rm = (me + 1) % n, left = -1, right = -1;
  if (n > 1 && coll__net_add_peer(net, all[lm], lens[lm], &left, err, sizeof err) != 0) return 4;
  if (n > 1 && rm != lm && coll__net_add_peer(net, all[rm], lens[rm], &right, err, sizeof err) != 0) return 4;
  if (rm == lm) right = left;
  coll__net_ring_t *ring = NULL;
  if (coll__net_ring_make(net, n, me, left, right, &ring) != 0) return 5;
  for (int k = 0; k < nsizes; k++) {
    size_t count = sizes[k] / 4 ? sizes[k] / 4 : 1;
    float *buf = calloc(count, 4);
    /* the calls to time: member 0 decides from a warm-up and tells the others in a call */
    double t0 = now();
    for (int w = 0; w < 3; w++) rc |= one_call(ring, net, me, right, buf, sizes[k], err, sizeof err);
    float iters = (float)(seconds / ((now() - t0) / 3 + 1e-6));
    iters = iters < 5 ? 5 : iters > 100000 ? 100000 : iters;
    float agree = me == 0 ? iters : 0;
    /* pingpong: a fixed count, no ring call (its notes would meet the pings) */
    if (!strcmp(kind, "pingpong")) agree = 5000;
    else rc |= coll__net_ring_allreduce(ring, COLL_FLOAT32, COLL_MAX, &agree, 1, 60, err, sizeof err);
    long its = (long)agree;
    t0 = now();
    for (long i = 0; i < its && rc == 0; i++) {
      buf[0] = (float)i;
      rc = one_call(ring, net, me, right, buf, sizes[k], err, sizeof err);
    }
    if (rc == 0) rc = coll__net_flush(net, err, sizeof err);
    double us = (now() - t0) / (double)its * 1e6 / (!strcmp(kind, "pingpong") ? 2 : 1);
    free(buf);
    if (rc) return fprintf(stderr, "member %d: %s\n", me, err), 6;
    if (write(fd, &us, sizeof us) != sizeof us) return 7;
  }
  char done;
  if (read(fd, &done, 1) != 1) return 8;
  coll__net_ring_free(ring);
  coll__net_close(net);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: net_bench NS0,NS1[,...] [-i IFACE] [-s BYTES,...] [-t SECONDS]\n");
    return 2;
  }
  char *names[MAX_MEMBERS];
  int n = 0;
  for (char *tok = strtok(argv[1], ","); tok && n < MAX_MEMBERS; tok = strtok(NULL, ",")) names[n++] = tok;
  const char *iface = "hbnet0";
  size_t sizes[32] = {8, 65536, 1 << 20, 16 << 20};
  int nsizes = 4;
  double seconds = 1.0;
  for (int a = 2; a + 1 < argc; a += 2) {
    if (!strcmp(argv[a], "-i")) iface = argv[a + 1];
    else if (!strcmp(argv[a], "-t")) seconds = atof(argv[a + 1]);
    else if (!strcmp(argv[a], "-k")) kind = argv[a + 1];
    else if (!strcmp(argv[a], "-p")) pool_bytes = (size_t)strtoull(argv[a + 1], NULL, 10);
    else if (!strcmp(argv[a], "-s")) {
      nsizes = 0;
      for (char *tok = strtok(argv[a + 1], ","); tok && nsizes < 32; tok = strtok(NULL, ","))
        sizes[nsizes++] = (size_t)strtoull(tok, NULL, 10);
    }
  }
  setenv("FI_TCP_IFACE", iface, 0);
  int sv[MAX_MEMBERS][2];
  pid_t pids[MAX_MEMBERS];
  for (int m = 0; m < n; m++) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[m]) != 0) return 2;
    if ((pids[m] = fork()) == 0) {
      for (int o = 0; o <= m; o++) close(sv[o][0]);
      _exit(member(m, n, sv[m][1], names[m], iface, sizes, nsizes, seconds));
    }
    close(sv[m][1]);
  }
  uint32_t lens[MAX_MEMBERS] = {0};
  static uint8_t cards[MAX_MEMBERS][COLL_NET_CARD_MAX];
  int ok = 1;
  for (int m = 0; m < n; m++)
    ok &= read(sv[m][0], &lens[m], 4) == 4 && read(sv[m][0], cards[m], lens[m]) == (ssize_t)lens[m];
  for (int m = 0; ok && m < n; m++)
    ok &= write(sv[m][0], lens, sizeof lens) == sizeof lens && write(sv[m][0], cards, sizeof cards) == sizeof cards;
  for (int k = 0; ok && k < nsizes; k++) {
    double worst = 0, us;
    for (int m = 0; m < n; m++) {
      if (read(sv[m][0], &us, sizeof us) != sizeof us) ok = 0;
      else if (us > worst) worst = us;
    }
    if (ok) printf("allreduce %zu B: %.2f us\n", sizes[k], worst);
    fflush(stdout);
  }
  char done = 'd';
  for (int m = 0; m < n; m++) (void)!write(sv[m][0], &done, 1);
  int st, bad = 0;
  for (int m = 0; m < n; m++) {
    waitpid(pids[m], &st, 0);
    bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return ok && !bad ? 0 : 1;
}
