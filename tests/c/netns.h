/*
 * netns.h - emulated nodes for the C tests: network namespaces on one bridge.
 *
 * netns_up(&nodes, n) makes a namespace for the bridge (hbbr0) and one per node, each with
 * one veth interface hbnet0 (10.77.0.<node+1>/24) whose other end is on the bridge, as
 * rdma-bridge.md section 5 describes. A forked rank enters its node with netns_enter; pipes
 * and memory still cross (only the network is separate), which is what a test needs to
 * swap cards out of band. netns_loss(&nodes, pct) drops that share of the bridge's frames
 * (nft; netem is not in this kernel). netns_down removes every namespace, and with them the
 * interfaces and rules (and netns_up first removes those of a run that was killed before
 * its netns_down). Needs root and iproute2: netns_up returns -1 with the reason
 * otherwise, for a skip.
 *
 * Header-only (static functions); the test defines nothing first.
 */
#ifndef HBMCOLL_TESTS_C_NETNS_H
#define HBMCOLL_TESTS_C_NETNS_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NETNS_MAX 8

typedef struct {
  int n;
  char bridge[32], node[NETNS_MAX][32];
  char why[160];
} netns_t;

/* Run a shell command (printf-style) quietly; 0 when it exited 0. */
__attribute__((format(printf, 1, 2))) static inline int netns_sh(const char *fmt, ...) {
  char cmd[768];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(cmd, sizeof cmd - 20, fmt, ap);
  va_end(ap);
  if (len < 0 || (size_t)len >= sizeof cmd - 20) return -1;
  strcat(cmd, " >/dev/null 2>&1");
  return system(cmd) == 0 ? 0 : -1;
}

static inline void netns_down(netns_t *ns) {
  for (int i = 0; i < ns->n; i++) netns_sh("ip netns del %s", ns->node[i]);
  if (ns->bridge[0]) netns_sh("ip netns del %s", ns->bridge);
  ns->n = 0;
  ns->bridge[0] = '\0';
}

/* Namespaces of an earlier run that was killed before netns_down (hbt<pid>...): removed. */
static inline void netns_sweep(void) {
  DIR *d = opendir("/var/run/netns");
  struct dirent *e;
  while (d && (e = readdir(d)) != NULL) {
    int pid = 0;
    if (sscanf(e->d_name, "hbt%d", &pid) == 1 && pid > 0 && kill(pid, 0) != 0 && errno == ESRCH)
      netns_sh("ip netns del %s", e->d_name);
  }
  if (d) closedir(d);
}

static inline int netns_up(netns_t *ns, int n) {
  memset(ns, 0, sizeof *ns);
  netns_sweep();
  if (geteuid() != 0 || n > NETNS_MAX) {
    snprintf(ns->why, sizeof ns->why, "emulated nodes need root (network namespaces)");
    return -1;
  }
  const char *b = ns->bridge;
  snprintf(ns->bridge, sizeof ns->bridge, "hbt%dbr", (int)getpid());
  if (netns_sh("ip netns add %s && ip -n %s link add hbbr0 type bridge && ip -n %s link set hbbr0 up",
               b, b, b)) {
    snprintf(ns->why, sizeof ns->why, "ip netns add failed (iproute2 missing, or no namespaces here)");
    netns_sh("ip netns del %s", b);
    ns->bridge[0] = '\0';
    return -1;
  }
  for (int i = 0; i < n; i++) {
    const char *m = ns->node[i];
    snprintf(ns->node[i], sizeof ns->node[i], "hbt%dn%d", (int)getpid(), i);
    ns->n = i + 1;
    if (netns_sh("ip netns add %s && ip link add hbnet0 netns %s type veth peer name hbp%d netns %s && "
                 "ip -n %s link set hbp%d master hbbr0 up && ip -n %s addr add 10.77.0.%d/24 dev hbnet0 && "
                 "ip -n %s link set hbnet0 up && ip -n %s link set lo up",
                 m, m, i, b, b, i, m, i + 1, m, m)) {
      snprintf(ns->why, sizeof ns->why, "could not wire node %d into the bridge", i);
      netns_down(ns);
      return -1;
    }
  }
  return 0;
}

/* Drop pct of 100 frames crossing the bridge, at random. */
static inline int netns_loss(const netns_t *ns, int pct) {
  const char *b = ns->bridge;
  return netns_sh("ip netns exec %s nft add table bridge hbloss && ip netns exec %s nft add chain bridge "
                  "hbloss drops '{ type filter hook forward priority 0 ; }' && ip netns exec %s nft add "
                  "rule bridge hbloss drops counter && ip netns exec %s nft add rule bridge hbloss drops "
                  "numgen random mod 100 '<' %d counter drop", b, b, b, b, pct);
}

/* Frames the bridge saw and dropped since netns_loss (-1 when unreadable). */
static inline int netns_counts(const netns_t *ns, long *seen_p, long *dropped_p) {
  char cmd[160], line[256];
  snprintf(cmd, sizeof cmd, "ip netns exec %s nft list chain bridge hbloss drops 2>/dev/null", ns->bridge);
  FILE *f = popen(cmd, "r");
  if (f == NULL) return -1;
  long v[2] = {-1, -1};
  int k = 0;
  while (fgets(line, sizeof line, f) && k < 2) {
    const char *at = strstr(line, "counter packets ");
    if (at) v[k++] = strtol(at + 16, NULL, 10);
  }
  pclose(f);
  *seen_p = v[0], *dropped_p = v[1];
  return k == 2 ? 0 : -1;
}

/* In a forked rank: move this process into node i's network. */
static inline int netns_enter(const netns_t *ns, int i) {
  char path[96];
  snprintf(path, sizeof path, "/var/run/netns/%s", ns->node[i]);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  return rc;
}

#endif /* HBMCOLL_TESTS_C_NETNS_H */
