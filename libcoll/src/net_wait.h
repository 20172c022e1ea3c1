/*
 * net_wait.h - how the bridge's waits spend the time between polls (net_wait.c), for net_ofi.c:
 * the completion queue's wait object, the spin measured at open, the block in the kernel.
 * Callers outside the bridge use coll__net_idle (net.h).
 */
#ifndef COLL_NET_WAIT_H
#define COLL_NET_WAIT_H

#include "net.h"
#ifdef COLL_NET_OFI
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

typedef struct {
  struct fid_fabric *fabric;
  struct fid_cq *cq;
  int fd;        /* the CQ's wait object; -1: the provider gives none, and a wait yields */
  double spin_s; /* the shortest stretch of empty polls before the wait blocks: the wake-up measured */
  int quota;        /* the cgroup caps CPU time: spins are spin_s */
  /* a hint that threads sharing the waiter (nodes_p2p.c) may race on: read and written whole */
  _Atomic int busy;         /* the machine's cores were all wanted at the last look: spins are spin_s */
  _Atomic double next_look; /* when to look again (CLOCK_MONOTONIC seconds) */
  _Atomic unsigned stirs;   /* wake-ups sent by threads that read others' completions (coll__net_waiter_stir) */
  uint64_t blocks, woken; /* blocks so far, and those the CQ's fd ended */
  char how[112]; /* one phrase for coll__net_describe */
} coll__net_waiter_t;

/* The wait object to ask for when opening the CQ; where fi_cq_open refuses it, the CQ is opened
 * with FI_WAIT_NONE and coll__net_waiter_open is told so. */
#define COLL_NET_WAIT_OBJ FI_WAIT_FD
#define COLL_NET_SPIN_S 200e-6 /* the longest spin, on a machine with cores to spare */
#define COLL_NET_LOOK_S 0.05   /* how often a wait looks at the machine's runnable tasks */

/* Once the CQ is open (wait_obj: what it was opened with): its fd (fi_control FI_GETWAIT) and
 * the spin, measured here (what a sleep and a wake-up cost on this machine). Never fails:
 * without an fd the waits yield, and w->how says so. */
void coll__net_waiter_open(coll__net_waiter_t *w, struct fid_fabric *fabric, struct fid_cq *cq,
                           enum fi_wait_obj wait_obj);

/* After an empty poll of a wait whose empty stretch began at *since (0: now): 0 while the
 * stretch is shorter than the spin (net_wait.c: COLL_NET_SPIN_S on an idle machine, else
 * w->spin_s); then blocks in the kernel (fi_trywait, poll(2)) until the
 * CQ's fd stirs, watch_fd (>= 0) closes or fails, one of extra[0..nextra) has its events, `until`
 * (CLOCK_MONOTONIC seconds, 0: none) or most_s passed, and returns 1 (2: watch_fd closed).
 * Where fi_trywait says completions are waiting it returns 0 at once; without an fd it yields
 * the core and returns 1. seen (NULL: one thread waits) is w->stirs as the caller read it before
 * it last looked for its completion: a stir since then returns 0 at once (fi_trywait clears the
 * fd's signal, so a stir sent before it would be lost, and the wait would sleep a whole most_s). */
int coll__net_waiter_idle(coll__net_waiter_t *w, double *since, double until, double most_s, int watch_fd,
                          struct pollfd *extra, int nextra, const unsigned *seen);
/* Wake the threads blocked on w: this thread read completions one of them may wait for. */
void coll__net_waiter_stir(coll__net_waiter_t *w);

#endif /* COLL_NET_OFI */
#endif /* COLL_NET_WAIT_H */
