/*
 * p2p.c - the point-to-point calls (coll_send, coll_recv, coll_isend, coll_irecv), their
 * requests, and waiting.
 *
 * State. A communicator's point-to-point state (p2p.h) is made at its first call: per peer
 * counters and queues in this process, and a lock, held only for short steps (never across a
 * sleep or a spin's pause), so calls from several threads go on at once: a thread blocked in
 * recv does not hold up a send from another. Every wait, of a blocking call or a request, and
 * every coll_req_test moves all of this rank's point-to-point work along (pushes queued sends,
 * takes incoming cells, notices pulled rendezvous), so an irecv posted before a blocking send
 * is filled while that send waits. While no thread of the rank is in a call, its helper thread
 * (p2p_helper.c), asked by a peer that has waited 20 ms for it, does the same: an isend whose
 * pieces go through the cells, or an irecv, finishes while the rank is in a collective.
 *
 * Waiting, as sync.c waits for the collectives' flags, but shorter: spin at most P2P_SPIN_S
 * (200 us; the communicator's budget; 50 us when ranks outnumber CPUs, and for a second after a
 * spin was preempted), then sleep on this rank's doorbell (p2p_channel.c) in 10 ms slices.
 * No sched_yield phase: on a loaded machine a yield hands the CPU to a busy process for a whole
 * time slice, while a futex wake gets it back at once. Only after 1 ms does a wait pull
 * unexpected large messages (p2p_match.c), so a ping-pong whose receive comes a moment late
 * still copies once. Every 20 ms of the slow path it checks whether the peer it waits for has
 * died or left (coll__peer_gone, the communicator's own watch of its ranks: that fails the
 * communicator with COLL_EPEERLOST, as a collective would), the communicator's timeout and,
 * for blocking calls and coll_req_free, the interrupt callback (Ctrl-C); asks the peers it
 * waits for for help (at 20 ms, then at doubling intervals up to 320 ms); and past
 * HBMCOLL_STALL_WARN says who it waits for (the warn callback), as collectives do. A failure of the communicator, from any rank, ends every wait. A timeout
 * or an interrupt of a blocking call withdraws its operation (a receive never matched, a send
 * never taken) and leaves the communicator usable; only a send cut half way through the
 * channel in pieces cannot be withdrawn, and fails the communicator.
 *
 * Lifetime. The state counts its users: the communicator and each request not yet freed. At
 * coll_comm_free it makes waiting threads leave, fails pending requests with COLL_EABORTED
 * (revoking their rendezvous, so no peer reads a buffer that is about to go), and forgets the
 * communicator; a request freed later only frees its own memory.
 */
#include <errno.h>
#include <linux/futex.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

#include "nodes.h"
#include "p2p.h"

#define P2P_SLICE_MS 10
#define P2P_CHECK_S 0.02        /* peer, interrupt, help and stall checks this often */
#define P2P_SPIN_S 200e-6       /* the longest spin, where every rank has a CPU (a 1 MiB
                                 * message copied by both ends takes about 100 us) */
#define P2P_SPIN_LOADED_S 50e-6 /* ... and where they do not, or a spin was preempted (a 64 KiB
                                 * message takes 20 us) */
#define P2P_PREEMPTED_S 30e-6   /* a spin step this long was preempted ... */
#define P2P_LOADED_S 1.0        /* ... and waits sleep at once for this long */
#define P2P_ASK_MAX_S 0.32      /* a waiter asks its peers for help at most this far apart */
#define P2P_DEEP_S 0.001        /* unexpected large messages pulled aside after this long */

static pthread_mutex_t p2p_make_lock = PTHREAD_MUTEX_INITIALIZER;

static double p2p_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* With the lock held: drop one user, and unlock (or free the state, after the last). */
static void p2p_unref(coll__p2p_t *p) {
  if (--p->refs > 0) {
    pthread_mutex_unlock(&p->lock);
    return;
  }
  free(p->sent);
  free(p->tail_seen);
  free(p->rdv_next);
  free(p->taken);
  free(p->outq);
  free(p->cur);
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->idle);
  free(p);
}

/* The state, made at the first call; NULL (out of memory). */
static coll__p2p_t *p2p_get(coll_comm_t *c) {
  pthread_mutex_lock(&p2p_make_lock);
  coll__p2p_t *p = c->p2p;
  if (p == NULL && (p = calloc(1, sizeof *p)) != NULL) {
    size_t n = (size_t)c->size;
    p->sent = calloc(n, sizeof *p->sent);
    p->tail_seen = calloc(n, sizeof *p->tail_seen);
    p->rdv_next = calloc(n, sizeof *p->rdv_next);
    p->taken = calloc(n, sizeof *p->taken);
    p->outq = calloc(n, sizeof *p->outq);
    p->cur = calloc(n, sizeof *p->cur);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->refs = 1;
    p->c = c;
    p->rank = c->rank;
    p->size = c->size;
    p->cells = c->hdr->p2p_cells;
    p->stride = c->hdr->p2p_stride;
    p->bells = (coll__p2p_bell_t *)(c->base + c->hdr->p2p_off);
    p->chans = c->base + c->hdr->p2p_off + n * COLL_LINE;
    if (!p->sent || !p->tail_seen || !p->rdv_next || !p->taken || !p->outq || !p->cur) {
      pthread_mutex_lock(&p->lock);
      p2p_unref(p);
      p = NULL;
    } else {
      int rc = coll__p2p_helper_start(p);
      if (rc != 0) /* still correct while this rank calls in; a peer may wait for it meanwhile */
        coll__warn(c, "rank %d: no point-to-point helper thread (pthread_create: %s): a send or "
                   "receive this rank posted moves only while it is in a point-to-point call",
                   c->rank, strerror(-rc));
    }
    c->p2p = p;
  }
  pthread_mutex_unlock(&p2p_make_lock);
  return p;
}

static int p2p_check(coll_comm_t *c, const void *buf, size_t bytes, int peer, int tag, int any) {
  if (c == NULL || (buf == NULL && bytes > 0)) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (peer < (any ? COLL_ANY_SOURCE : 0) || peer >= c->size) return COLL_EBADARG;
  if (tag < (any ? COLL_ANY_TAG : 0)) return COLL_EBADARG;
  return c->error;
}

static int p2p_done(const coll__p2p_op_t *op) { return op->stage == OP_DONE; }

/* After what this thread waits for, a dead or departed peer: fail the communicator. */
static int p2p_check_peer(coll__p2p_t *p, coll__p2p_op_t *op) {
  int peer = op->peer;
  if (peer == COLL_ANY_SOURCE || peer == p->rank) return 0;
  int gone = coll__peer_gone(p->c, peer);
  if (gone == 0) return 0;
  coll__p2p_progress(p, 1); /* what it sent before it went is still ours */
  if (p2p_done(op)) return 0;
  return coll__fail(p->c, COLL_EPEERLOST, "rank %d is gone (pid %d %s) while rank %d waited to %s it; "
                    "the communicator is closed", peer, (int)p->c->ctl[peer].pid,
                    gone == 1 ? "died" : "closed the communicator", p->rank,
                    op->send ? "send to" : "receive from");
}

/* A live peer keeps this wait long: say who and what, as sync.c says it for collectives. */
static void p2p_warn_stall(coll__p2p_t *p, const coll__p2p_op_t *op, double waited) {
  char who[32], tag[24];
  if (op->peer == COLL_ANY_SOURCE) snprintf(who, sizeof who, "any rank");
  else snprintf(who, sizeof who, "rank %d", op->peer);
  if (op->tag == COLL_ANY_TAG) snprintf(tag, sizeof tag, "any tag");
  else snprintf(tag, sizeof tag, "tag %d", op->tag);
  coll__warn(p->c, "rank %d has waited %.0f s to %s %s (%s, %zu bytes)%s; the peers are alive (a slow rank, "
             "or a %s that was never posted)%s", p->rank, waited, op->send ? "send to" : "receive from", who,
             tag, op->bytes, op->stage == OP_TAKING ? ", part of it came" : "", op->send ? "receive" : "send",
             p->c->params.timeout_s > 0 ? "" : "; HBMCOLL_TIMEOUT=S makes such a wait an error");
}

/* Whom op waits for asks for help (p2p_helper.c): its peer, or every rank for ANY_SOURCE. */
static void p2p_ask_peers(coll__p2p_t *p, const coll__p2p_op_t *op) {
  int peer = op->stage == OP_TAKING ? op->status.source : op->peer;
  if (peer != COLL_ANY_SOURCE) {
    coll__p2p_ask(p, peer);
    return;
  }
  for (int r = 0; r < p->size; r++) coll__p2p_ask(p, r);
}

/* With the lock held: until op is done (0), or -ETIMEDOUT at `until`, COLL_EINTERRUPTED
 * (blocking calls only), the communicator's failure, COLL_EABORTED when it is being freed.
 *
 * Spin only while it pays: at most P2P_SPIN_S (and the communicator's spin budget), and only
 * P2P_SPIN_LOADED_S when ranks outnumber CPUs or for a while once a spin found itself
 * preempted (a step that took P2P_PREEMPTED_S: another thread wants this CPU, maybe the peer
 * we wait for).
 * Then sleep on the doorbell at once: under load a futex wake gets the CPU back at once,
 * where sched_yield against a busy process gives it away for a whole time slice. */
static int p2p_wait(coll__p2p_t *p, coll__p2p_op_t *op, double until, int blocking) {
  coll__p2p_progress(p, 0);
  if (p2p_done(op)) return 0;
  coll_comm_t *c = p->c;
  if (c == NULL) return COLL_EABORTED;
  p->inside++;
  int rc = 0;
  double start = p2p_now(), last = start;
  double spin_s = c->yield_budget > 2 && start >= p->loaded_until ? P2P_SPIN_S : P2P_SPIN_LOADED_S;
  for (long i = 0; i < c->spin_iters && rc == 0; i++) {
    pthread_mutex_unlock(&p->lock);
    coll__relax();
    pthread_mutex_lock(&p->lock);
    if (p->c == NULL) rc = COLL_EABORTED;
    else if ((coll__p2p_progress(p, 0), p2p_done(op))) goto out;
    else if ((i & 15) == 15) {
      double t = p2p_now();
      if (t - last > P2P_PREEMPTED_S) p->loaded_until = t + P2P_LOADED_S;
      if (t - last > P2P_PREEMPTED_S || t - start > spin_s) break;
      last = t;
      if ((i & 255) == 255 && coll__aborted(c)) rc = coll__aborted(c);
    }
  }
  double next_check = start + P2P_CHECK_S, ask_every = P2P_CHECK_S, next_ask = start + P2P_CHECK_S;
  double stall = c->params.stall_warn_s, next_warn = stall > 0 ? start + stall : INFINITY;
  coll__p2p_bell_t *bell = &p->bells[p->rank];
  while (rc == 0) {
    if (p->c == NULL) {
      rc = COLL_EABORTED;
      break;
    }
    double now = p2p_now();
    coll__p2p_progress(p, 0);
    if (p2p_done(op)) break;
    if (now - start >= P2P_DEEP_S) coll__p2p_progress(p, 1); /* only then: a late recv still copies once */
    if ((rc = coll__aborted(c)) != 0) break;
    uint32_t b = atomic_load_explicit(&bell->bell, memory_order_seq_cst);
    atomic_fetch_add_explicit(&bell->sleepers, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    coll__p2p_progress(p, 0); /* what was published before the count went up */
    int ready = p2p_done(op) || coll__aborted(c);
    pthread_mutex_unlock(&p->lock);
    if (!ready) {
      double left = until - now;
      long ns = P2P_SLICE_MS * 1000000L;
      if (left < 0.01 && left > 0) ns = (long)(left * 1e9) + 1;
      struct timespec ts = {0, ns};
      syscall(SYS_futex, &bell->bell, FUTEX_WAIT, b, &ts, NULL, 0);
    }
    atomic_fetch_sub_explicit(&bell->sleepers, 1, memory_order_seq_cst);
    pthread_mutex_lock(&p->lock);
    now = p2p_now();
    if (p->c == NULL || p2p_done(op)) continue;
    if (now >= until) rc = -ETIMEDOUT;
    if (rc || now < next_check) continue;
    next_check = now + P2P_CHECK_S;
    if ((rc = p2p_check_peer(p, op)) != 0) break;
    if (blocking && c->interrupt_fn) { /* without the lock: Python's takes the GIL, which a caller may hold */
      coll_interrupt_fn fn = c->interrupt_fn;
      void *arg = c->interrupt_arg;
      pthread_mutex_unlock(&p->lock);
      int stop = fn(arg);
      pthread_mutex_lock(&p->lock);
      if (p->c == NULL) rc = COLL_EABORTED;
      else if (stop && !p2p_done(op)) rc = COLL_EINTERRUPTED;
      if (rc || p2p_done(op)) break;
    }
    if (now >= next_ask) { /* 20 ms, then less and less often: a long wait costs its peers little */
      p2p_ask_peers(p, op);
      ask_every = ask_every * 2 < P2P_ASK_MAX_S ? ask_every * 2 : P2P_ASK_MAX_S;
      next_ask = now + ask_every;
    }
    if (now >= next_warn) {
      p2p_warn_stall(p, op, now - start);
      next_warn = start + 2 * (now - start); /* then at doubling intervals, as sync.c */
    }
  }
out:
  if (--p->inside == 0) pthread_cond_broadcast(&p->idle);
  return p2p_done(op) ? 0 : rc;
}

/* The deadline of a wait of timeout_s (< 0: none) under the communicator's timeout. */
static double p2p_until(coll_comm_t *c, double timeout_s) {
  double until = timeout_s >= 0 ? p2p_now() + timeout_s : INFINITY;
  if (c && c->params.timeout_s > 0 && p2p_now() + c->params.timeout_s < until)
    until = p2p_now() + c->params.timeout_s;
  return until;
}

/* A rendezvous send that could not be revoked: its receiver is copying; wait that out. */
static int p2p_settle_pull(coll__p2p_t *p, coll__p2p_op_t *op) {
  coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, op->peer);
  _Atomic uint64_t *w = &ch->rdv[op->rdv % COLL_P2P_RDV];
  while (atomic_load_explicit(w, memory_order_acquire) != (op->rdv << 2 | RDV_DONE)) {
    if (p->c == NULL || coll__peer_gone(p->c, op->peer)) return 0; /* it died copying: nobody reads us now */
    sched_yield();
  }
  coll__p2p_list_remove(&p->pulls, op);
  return 1;
}

/* A wait that ended in rc: withdraw op and say what the call returns. */
static int p2p_give_up(coll__p2p_t *p, coll__p2p_op_t *op, int rc) {
  int w = coll__p2p_withdraw(p, op);
  if (w == 2) {
    if (p2p_settle_pull(p, op)) {
      coll__p2p_finish(p, op, 0);
      return 0; /* it was taken after all */
    }
    coll__p2p_list_remove(&p->pulls, op);
  }
  if (w != 1 && p->c && !coll__aborted(p->c)) {
    int code = rc == COLL_EINTERRUPTED ? COLL_EPEERLOST : rc;
    coll__fail(p->c, code, "rank %d gave up a send to rank %d half way through (%s); the communicator "
               "is closed", p->rank, op->peer, coll_err_name(rc));
  }
  op->stage = OP_DONE;
  return rc;
}

/* Blocking calls: op lives on the caller's stack. */
/* A send joins its peer's queue (and the helper is told), a receive is matched or posted.
 * Under p->lock. */
static void p2p_enqueue(coll__p2p_t *p, coll__p2p_op_t *op) {
  if (op->send) {
    op->stage = OP_QUEUED;
    coll__p2p_list_push(&p->outq[op->peer], op);
    coll__p2p_push(p, op->peer);
  } else {
    coll__p2p_post_recv(p, op);
  }
}

static int p2p_block(coll_comm_t *c, coll__p2p_op_t *op) {
  coll__p2p_t *p = p2p_get(c);
  if (p == NULL) return -ENOMEM;
  pthread_mutex_lock(&p->lock);
  if (p->c == NULL) {
    pthread_mutex_unlock(&p->lock);
    return COLL_EABORTED;
  }
  op->p = p;
  p2p_enqueue(p, op);
  int rc = p2p_done(op) ? 0 : p2p_wait(p, op, p2p_until(c, -1), 1);
  rc = rc == 0 ? op->result : p2p_give_up(p, op, rc);
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int coll_send(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag) {
  if (c && c->span) return coll__span_send(c, buf, bytes, dest, tag);
  int rc = p2p_check(c, buf, bytes, dest, tag, 0);
  if (rc) return rc;
  coll__p2p_op_t op = {.send = 1, .peer = dest, .tag = tag, .buf = (uint8_t *)(uintptr_t)buf, .bytes = bytes};
  return p2p_block(c, &op);
}

int coll_recv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_status_t *status_p) {
  if (c && c->span) return coll__span_recv(c, buf, bytes, source, tag, status_p);
  int rc = p2p_check(c, buf, bytes, source, tag, 1);
  if (rc) return rc;
  coll__p2p_op_t op = {.peer = source, .tag = tag, .buf = buf, .bytes = bytes};
  rc = p2p_block(c, &op);
  if ((rc == 0 || rc == COLL_EMISMATCH) && status_p) *status_p = op.status;
  return rc;
}

static int p2p_req_wait(void *opv, double timeout_s);
static int p2p_req_test(void *opv, int *result_p);
static void p2p_req_free(void *opv);
static int p2p_req_status(void *opv, coll_status_t *status_p);
static int p2p_req_cancel(void *opv);
static const coll__req_ops_t p2p_req_ops = {p2p_req_wait, p2p_req_test, p2p_req_free, p2p_req_status, p2p_req_cancel};

static int p2p_start(coll_comm_t *c, coll__p2p_op_t *tmpl, coll_req_t **req_p) {
  if (req_p == NULL) return COLL_EBADARG;
  coll__p2p_t *p = p2p_get(c);
  coll__p2p_op_t *op = malloc(sizeof *op);
  coll_req_t *req = NULL;
  if (p == NULL || op == NULL || coll__req_wrap_p2p(op, &p2p_req_ops, &req) != 0) {
    free(op);
    return -ENOMEM;
  }
  *op = *tmpl;
  op->request = 1;
  op->p = p;
  pthread_mutex_lock(&p->lock);
  if (p->c == NULL) {
    pthread_mutex_unlock(&p->lock);
    free(op);
    free(req);
    return COLL_EABORTED;
  }
  p->refs++;
  op->lnext = p->live;
  if (p->live) p->live->lprev = op;
  p->live = op;
  p2p_enqueue(p, op);
  pthread_mutex_unlock(&p->lock);
  *req_p = req;
  return 0;
}

int coll_isend(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag, coll_req_t **req_p) {
  if (c && c->span) return coll__span_isend(c, buf, bytes, dest, tag, req_p);
  int rc = p2p_check(c, buf, bytes, dest, tag, 0);
  if (rc) return rc;
  coll__p2p_op_t op = {.send = 1, .peer = dest, .tag = tag, .buf = (uint8_t *)(uintptr_t)buf, .bytes = bytes};
  return p2p_start(c, &op, req_p);
}

int coll_irecv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_req_t **req_p) {
  if (c && c->span) return coll__span_irecv(c, buf, bytes, source, tag, req_p);
  int rc = p2p_check(c, buf, bytes, source, tag, 1);
  if (rc) return rc;
  coll__p2p_op_t op = {.peer = source, .tag = tag, .buf = buf, .bytes = bytes};
  return p2p_start(c, &op, req_p);
}

/* A request's wait ended in a failure of the communicator: that is its result for good. */
static int p2p_req_failed(coll__p2p_t *p, coll__p2p_op_t *op, int rc) {
  if (rc == -ETIMEDOUT || rc == COLL_EINTERRUPTED || p2p_done(op)) return rc;
  p2p_give_up(p, op, rc);
  coll__p2p_finish(p, op, rc);
  return rc;
}

static int p2p_req_wait(void *opv, double timeout_s) {
  coll__p2p_op_t *op = opv;
  coll__p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  int rc = 0;
  if (!p2p_done(op)) rc = p2p_req_failed(p, op, p2p_wait(p, op, p2p_until(p->c, timeout_s), 0));
  if (p2p_done(op)) rc = op->result;
  pthread_mutex_unlock(&p->lock);
  return rc;
}

static int p2p_req_test(void *opv, int *result_p) {
  coll__p2p_op_t *op = opv;
  coll__p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  if (!p2p_done(op) && p->c) {
    coll__p2p_progress(p, 0);
    int rc = coll__aborted(p->c);
    if (rc && !p2p_done(op)) p2p_req_failed(p, op, rc);
  }
  int done = p2p_done(op);
  if (done && result_p) *result_p = op->result;
  pthread_mutex_unlock(&p->lock);
  return done;
}

static int p2p_req_status(void *opv, coll_status_t *status_p) {
  coll__p2p_op_t *op = opv;
  coll__p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  int ok = p2p_done(op) && !op->send;
  if (ok) *status_p = op->status;
  pthread_mutex_unlock(&p->lock);
  return ok ? 0 : COLL_EBADARG;
}

static int p2p_req_cancel(void *opv) {
  coll__p2p_op_t *op = opv;
  coll__p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  int rc = -EBUSY;
  if (p2p_done(op)) {
    rc = -EALREADY;
  } else if (!op->send && op->stage == OP_POSTED) {
    coll__p2p_withdraw(p, op);
    coll__p2p_finish(p, op, -ECANCELED);
    rc = 0;
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

/* Nobody will see this request's result, and its buffer is about to go: wait as a blocking
 * call does, the interrupt check included (Ctrl-C withdraws it, or fails the communicator for a
 * send half way through the cells, as p2p_give_up says). */
static void p2p_req_free(void *opv) {
  coll__p2p_op_t *op = opv;
  coll__p2p_t *p = op->p;
  p2p_req_cancel(op); /* a receive nothing matched yet */
  pthread_mutex_lock(&p->lock);
  while (!p2p_done(op)) {
    int rc = p->c ? p2p_wait(p, op, p2p_until(p->c, -1), 1) : COLL_EABORTED;
    if (rc == COLL_EINTERRUPTED) {
      p2p_give_up(p, op, rc);
      coll__p2p_finish(p, op, rc);
    } else if (rc != 0 && rc != -ETIMEDOUT) {
      p2p_req_failed(p, op, rc);
    }
  }
  free(op);
  p2p_unref(p);
}

void coll__p2p_destroy(coll_comm_t *c) {
  coll__p2p_t *p = c->p2p;
  if (p == NULL) return;
  c->p2p = NULL;
  if (coll__forked(c)) return; /* the parent's: its lock may be held by a thread not here */
  coll__p2p_helper_stop(p); /* first: it reads p->c */
  pthread_mutex_lock(&p->lock);
  while (p->inside > 0) { /* waiters see p->c go and leave */
    coll__p2p_t *keep = p;
    keep->c = NULL;
    atomic_fetch_add(&p->bells[p->rank].bell, 1);
    syscall(SYS_futex, &p->bells[p->rank].bell, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
    pthread_cond_wait(&p->idle, &p->lock);
  }
  p->c = c; /* for the withdrawals below */
  while (p->live) {
    coll__p2p_op_t *op = p->live;
    p2p_give_up(p, op, COLL_EABORTED);
    coll__p2p_finish(p, op, COLL_EABORTED);
  }
  while (p->unx_head) {
    coll__p2p_msg_t *m = p->unx_head;
    p->unx_head = m->next;
    free(m->data);
    free(m);
  }
  p->c = NULL;
  p2p_unref(p);
}
