/*
 * p2p_helper.c - the helper thread of a rank's point-to-point state: progress while no thread
 * of this rank is in a point-to-point call.
 *
 * Why. A peer can finish most of what it needs from this rank without it (it pulls our large
 * message with process_vm_readv), but not everything: where the kernel refuses that (Yama
 * ptrace_scope=1 between siblings, some containers, HBMCOLL_P2P_CMA=0) a large send goes
 * through the cells in pieces and only the sender can push the next ones; a rendezvous or
 * the pieces of a message for a posted irecv need the receiver to take them; and a sender
 * blocked on a message nobody has posted a receive for yet (MPI calls that unsafe, the socket
 * path buffered it) needs the receiver to take it aside. If the rank that must act is in a
 * collective, computing, or sleeping, "isend; barrier; wait" against "recv; barrier" would
 * wait for ever. So every rank that uses point-to-point has one thread that acts for it.
 *
 * When it runs. Costs nothing on the fast path: asleep on its own futex word (`help`, in the
 * rank's doorbell line) while nobody needs it, woken only
 *  - by a peer whose wait for this rank has lasted 20 ms (p2p.c asks then, and again at
 *    doubling intervals up to 320 ms): it then makes one deep step (every channel, every queue, unexpected rendezvous
 *    pulled into buffers of their own, so their senders go on), and
 *  - to stop, at coll_comm_free.
 * After a step, if this rank still has work only it can move (coll__p2p_pending: a send not
 * wholly in its channel, a receive posted, pieces coming) and no thread of this rank is in a
 * wait (which moves everything itself), it stays on duty: it sleeps on the rank's doorbell as
 * a counted sleeper, so every cell freed or published for this rank wakes it, and it steps
 * again, until the work is done or a thread of the rank comes in. So a 16 MiB send through
 * the cells, asked for once, streams at the pace of its receiver.
 *
 * Why it cannot hang: a waiter asks every rank it may wait for (its peer, or all of them for
 * ANY_SOURCE) at least every 320 ms; each ask wakes that rank's helper, which steps with the lock (no
 * one holds it across a sleep) and, while its rank has work, keeps stepping on every ring.
 * What remains is a peer process that never made a point-to-point call (it has no helper: a
 * message it never asked for cannot be pending for it except unexpected ones; those wait for
 * its first call), or one that is stopped or dead (the waiter's own checks find that).
 */
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

#include "p2p.h"

#define HELPER_DUTY_MS 10   /* on duty: a look this often even without a ring */
#define HELPER_IDLE_S 1     /* off duty: a look this often (nothing should need it) */

static void helper_sleep(_Atomic uint32_t *word, uint32_t seen, long ns) {
  struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

static void *helper_main(void *arg) {
  coll__p2p_t *p = arg;
  coll__p2p_bell_t *me = &p->bells[p->rank];
  uint32_t seen = atomic_load(&me->help);
  pthread_mutex_lock(&p->lock);
  while (!p->helper_stop) {
    uint32_t h = atomic_load(&me->help);
    int asked = h != seen;
    seen = h;
    int duty = p->inside == 0 && coll__p2p_pending(p);
    if (asked || duty) coll__p2p_progress(p, asked);
    duty = p->inside == 0 && coll__p2p_pending(p);
    if (!duty) {
      pthread_mutex_unlock(&p->lock);
      helper_sleep(&me->help, seen, HELPER_IDLE_S * 1000000000L);
      pthread_mutex_lock(&p->lock);
      continue;
    }
    /* on duty: a counted sleeper on the doorbell, as a waiter (p2p.c) */
    uint32_t b = atomic_load_explicit(&me->bell, memory_order_seq_cst);
    atomic_fetch_add_explicit(&me->sleepers, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    coll__p2p_progress(p, 0);
    int more = !p->helper_stop && p->inside == 0 && coll__p2p_pending(p) && atomic_load(&me->help) == seen;
    pthread_mutex_unlock(&p->lock);
    if (more) helper_sleep(&me->bell, b, HELPER_DUTY_MS * 1000000L);
    atomic_fetch_sub_explicit(&me->sleepers, 1, memory_order_seq_cst);
    pthread_mutex_lock(&p->lock);
  }
  pthread_mutex_unlock(&p->lock);
  return NULL;
}

int coll__p2p_helper_start(coll__p2p_t *p) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old); /* signals go to the application's threads */
  int rc = pthread_create(&p->helper, NULL, helper_main, p);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) return -rc;
  p->helper_on = 1;
  return 0;
}

void coll__p2p_helper_stop(coll__p2p_t *p) {
  pthread_mutex_lock(&p->lock);
  int on = p->helper_on;
  p->helper_stop = 1;
  p->helper_on = 0;
  pthread_mutex_unlock(&p->lock);
  if (!on) return;
  coll__p2p_bell_t *me = &p->bells[p->rank];
  atomic_fetch_add(&me->help, 1);
  syscall(SYS_futex, &me->help, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
  atomic_fetch_add(&me->bell, 1); /* on duty it sleeps here */
  syscall(SYS_futex, &me->bell, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
  pthread_join(p->helper, NULL);
}

void coll__p2p_ask(coll__p2p_t *p, int rank) {
  if (rank == p->rank) return;
  coll__p2p_bell_t *b = &p->bells[rank];
  atomic_fetch_add_explicit(&b->help, 1, memory_order_seq_cst);
  syscall(SYS_futex, &b->help, FUTEX_WAKE, 1, NULL, NULL, 0);
  coll__p2p_ring(p, rank); /* a helper on duty sleeps on the doorbell */
}
