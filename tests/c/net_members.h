/*
 * net_members.h - members of a bridge ring on emulated nodes, for the C tests (header-only):
 * a forked member enters its node (netns.h), opens an endpoint on hbnet0 (tcp;ofi_rxm), sends
 * its card to the parent over a socket and gets everyone's back (swap_cards, the parent's side),
 * and makes the ring with every member reached. The parent forks the members and swaps their
 * cards (members_start), and reaps them (members_reap).
 *
 * Include after harness.h (MAX_RANKS) and netns.h.
 */
#ifndef HBMCOLL_TESTS_C_NET_MEMBERS_H
#define HBMCOLL_TESTS_C_NET_MEMBERS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net.h"
#include "net_ring.h"

/* Enter node `me`, open an endpoint, swap cards through the parent, make the ring: 0, or
 * the member's exit code. */
static int join(int me, int n, int fd, const netns_t *ns, size_t pool, coll__net_t **net_p, coll__net_ring_t **ring_p) {
  char err[256] = "";
  coll__net_t *net = NULL;
  setenv("FI_PROVIDER", "tcp", 1);
  setenv("FI_TCP_IFACE", "hbnet0", 1);
  if (netns_enter(ns, me) != 0) return 10;
  int rc = coll__net_open("hbnet0", pool, &net, err, sizeof err);
  if (rc) return fprintf(stderr, "member %d: open: %s\n", me, err), 11;
  uint8_t card[COLL_NET_CARD_MAX], all[MAX_RANKS][COLL_NET_CARD_MAX];
  uint32_t len = (uint32_t)coll__net_card(net, card), lens[MAX_RANKS];
  if (write(fd, &len, 4) != 4 || write(fd, card, len) != (ssize_t)len ||
      read(fd, lens, sizeof lens) != sizeof lens || read(fd, all, sizeof all) != sizeof all)
    return 12;
  int left = -1, right = -1;
  int lm = (me + n - 1) % n, rm = (me + 1) % n;
  if ((rc = coll__net_add_peer(net, all[lm], lens[lm], &left, err, sizeof err)) != 0) return 13;
  if (rm == lm) right = left;
  else if ((rc = coll__net_add_peer(net, all[rm], lens[rm], &right, err, sizeof err)) != 0) return 13;
  if (coll__net_ring_make(net, n, me, left, right, ring_p) != 0) return 14;
  for (int m = 0; m < n; m++) { /* every member reached: small allgathers take log2 n steps */
    int peer = m == lm ? left : m == rm ? right : -1;
    if (m != me && peer < 0 && coll__net_add_peer(net, all[m], lens[m], &peer, err, sizeof err) != 0) return 13;
    if (m != me && coll__net_ring_reach(*ring_p, m, peer) != 0) return 14;
  }
  *net_p = net;
  return 0;
}

/* The parent's side of the out-of-band exchange: every member's card (on fds[m]) to every
 * member. 1 when all came and went out. */
static int swap_cards(int fds[][2], int n) {
  uint32_t lens[MAX_RANKS] = {0};
  uint8_t cards[MAX_RANKS][COLL_NET_CARD_MAX];
  int ok = 1;
  for (int m = 0; m < n; m++)
    ok &= read(fds[m][0], &lens[m], 4) == 4 && lens[m] <= COLL_NET_CARD_MAX &&
          read(fds[m][0], cards[m], lens[m]) == (ssize_t)lens[m];
  for (int m = 0; ok && m < n; m++)
    ok &= write(fds[m][0], lens, sizeof lens) == sizeof lens && write(fds[m][0], cards, sizeof cards) == sizeof cards;
  return ok;
}

/* The members of one case, as the parent holds them: n, ns, alarm_s, nlinks and arg set, the
 * rest filled by members_start and members_reap. */
typedef struct members members_t;
struct members {
  int n;                   /* members */
  const netns_t *ns;       /* their nodes */
  unsigned alarm_s;        /* each member's alarm */
  int nlinks;              /* socket pairs made before the forks, each member's to keep or close; */
  int links[MAX_RANKS][2]; /* the parent closes its copies once every member is forked */
  void *arg;               /* the case's own */
  int fds[MAX_RANKS][2];   /* fds[m][0]: the parent's end of member m's socket */
  pid_t pids[MAX_RANKS];
  int status[MAX_RANKS];   /* waitpid's, once reaped (0 if waitpid failed) */
};

/* A member's body, in its forked process: its exit code. fd is its end of its socket to the parent. */
typedef int members_fn(const members_t *ms, int me, int fd);

/* Make the links, fork the members (member m, with an alarm and none of the parent's ends of the
 * sockets, exits with fn(ms, m, its end)), close the parent's copies of the links, and swap the
 * cards: 1 when all came and went out. */
static int members_start(members_t *ms, members_fn *fn) {
  for (int l = 0; l < ms->nlinks; l++)
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ms->links[l]) != 0) abort();
  for (int m = 0; m < ms->n; m++) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, ms->fds[m]) != 0) abort();
    if ((ms->pids[m] = fork()) == 0) {
      alarm(ms->alarm_s);
      for (int o = 0; o <= m; o++) close(ms->fds[o][0]);
      _exit(fn(ms, m, ms->fds[m][1]));
    }
    close(ms->fds[m][1]);
  }
  for (int l = 0; l < ms->nlinks; l++) close(ms->links[l][0]), close(ms->links[l][1]);
  return swap_cards(ms->fds, ms->n);
}

/* Wait for every member, in order, closing the parent's ends: 1 when all exited with 0, else 0
 * and, if why is not NULL and still empty, why names the first member that did not. */
static int members_reap(members_t *ms, char *why, size_t why_len) {
  int ok = 1;
  for (int m = 0; m < ms->n; m++) {
    int st = 0;
    waitpid(ms->pids[m], &st, 0);
    ms->status[m] = st;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ok = 0;
      if (why && !why[0])
        snprintf(why, why_len, "member %d exited with status %d", m, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    close(ms->fds[m][0]);
  }
  return ok;
}

#endif /* HBMCOLL_TESTS_C_NET_MEMBERS_H */
