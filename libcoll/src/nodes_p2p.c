/*
 * nodes_p2p.c - point-to-point on a communicator that spans nodes (coll_send ... on c->span):
 * tagged messages between every pair of its ranks (net_tagged.h), this node's peers included, so
 * that one matching engine, the provider's, sees every message: a receive from COLL_ANY_SOURCE takes
 * the first that came from anywhere, and messages from one rank match in the order it sent them.
 *
 * Every rank opens its endpoint when the communicator is made, and the cards are allgathered over
 * it (the job's channels are authenticated already). A tag is the communicator's 32 random bits
 * (drawn by its rank 0, the same on every rank) above the caller's tag; COLL_ANY_TAG ignores the
 * caller's bits. A rank that could not open its endpoint leaves the collectives working and every
 * point-to-point call returns COLL_ENOTSUP with that rank's sentence.
 *
 * Waiting: poll the completion queue (which drives the provider's progress), spinning up to 200 us
 * (none while a task outside the job wants the core, core_share.h; cut short when the spin is
 * preempted), then a block on its fd in slices (net_wait.c), watching the job's connection between the nodes: a lost
 * node, or any failure of the communicator, ends every wait with that failure. Every slice checks
 * the timeout, the interrupt callback (blocking calls) and, for a peer on this node, whether it
 * died (that fails the communicator with COLL_EPEERLOST, as p2p.c does). A timeout or an interrupt
 * withdraws a receive (fi_cancel); a send cannot be withdrawn on rxm once posted, so one cut short
 * fails the communicator. Until a message went to or came from the peer waited for (any peer, for
 * COLL_ANY_SOURCE), the first quarter second of waiting for it blocks in 1 ms slices: rxm's connection handshake
 * does not stir the fd (past that, a late first contact costs the waiter at most one slice). A
 * thread that reads another's completion signals the fd; a signal that came between the other's
 * last look and its block (fi_trywait clears it) is seen through a counter (net_wait.h), not slept
 * through. With three or more threads blocked at once, one may still sleep a slice: another's
 * fi_trywait can clear the signal before the woken one looks. Sends are posted in call order; the
 * provider's "try again" queues them.
 *
 * Lifetime as in p2p.c: the state counts the communicator and the requests not yet freed; at
 * coll_comm_free pending requests end with COLL_EABORTED and the endpoint closes. Operations live
 * on the heap, blocking calls' too: one given up while the provider still holds it (a send when
 * the communicator failed) is kept until its completion comes or the endpoint closes, as the
 * provider writes its completion into it.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "coll_internal.h"
#include "core_share.h"
#include "net_tagged.h"
#include "nodes.h"

#define SP_SLICE_S 0.02  /* a block's longest slice: checks this often */
#define SP_SETTLING_S 0.001 /* a block's slice while a connection may be in setup: poll(2)'s least */
#define SP_SETTLING_FOR_S 0.25 /* ... in a wait's first quarter second: a handshake takes tens of ms */
#define SP_SPIN_S 200e-6 /* the longest spin before a block, as p2p.c's: a wake-up from the fd costs
                          * tens of us on a VM, a message's round trip across a link about as much */
#define SP_PREEMPTED_S 30e-6 /* a spin step this long was preempted: block from then on */
#define SP_CANCEL_S 1.0  /* a withdrawn receive's cancellation comes back within this */
#define SP_TAG_BITS 0xffffffffull

typedef struct sp_op sp_op_t;
struct sp_op {
  coll__tagged_op_t t; /* first: the provider's context */
  int send, peer, tag;
  const void *buf;
  size_t bytes;
  int posted, done, result, request;
  double first_wait; /* when a wait for it began first (0: none yet; a caller may wait in pieces) */
  coll_status_t status;
  coll__span_p2p_t *p;
  sp_op_t *lprev, *lnext; /* unfinished requests */
  sp_op_t *qnext;         /* waiting to be posted */
  sp_op_t *onext;         /* orphans: given up while the provider still holds them */
};

struct coll__span_p2p {
  pthread_mutex_t lock;
  pthread_cond_t idle;
  coll__tagged_t *ep; /* NULL: none (why) */
  int rc;
  char why[COLL__NODES_TEXT];
  uint64_t token;
  coll_comm_t *c; /* NULL once freed */
  int refs, inside;
  int doomed; /* sp_drop_endpoint: nobody drives the provider any more; the last waiter closes it */
  sp_op_t *live;
  sp_op_t *qhead, *qtail;
  sp_op_t *orphans; /* freed once their completion came, or the endpoint closed */
  uint8_t *contacted; /* per rank: a message went or came, so the connection is up */
  int size, uncontacted;
};

typedef struct {
  int32_t rc;
  uint32_t len, token, pad;
  uint8_t card[COLL_NET_CARD_MAX];
  char error[192];
} sp_card_t;
_Static_assert(sizeof(sp_card_t) % 4 == 0, "cards travel as int32");

static double sp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sp_unref(coll__span_p2p_t *p) { /* the lock held */
  if (--p->refs > 0) {
    pthread_mutex_unlock(&p->lock);
    return;
  }
  pthread_mutex_unlock(&p->lock);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->idle);
  free(p->contacted);
  free(p);
}

int coll__span_p2p_open(coll_comm_t *c, coll__span_p2p_t **p_p, char *err, size_t errlen) {
  coll__span_p2p_t *p = calloc(1, sizeof *p);
  sp_card_t mine = {0}, *all = calloc((size_t)c->size, sizeof *all);
  uint8_t *contacted = calloc((size_t)c->size, 1);
  if (p == NULL || all == NULL || contacted == NULL) {
    free(p), free(all), free(contacted);
    snprintf(err, errlen, "out of memory for point-to-point across nodes");
    return -ENOMEM;
  }
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->idle, NULL);
  p->refs = 1, p->c = c;
  p->contacted = contacted, p->size = p->uncontacted = c->size; /* self too: rxm connects to itself */
  mine.rc = coll__tagged_open(coll__span_iface(c), coll__span_family(c), &p->ep, mine.error, sizeof mine.error);
  if (mine.rc == 0) mine.len = (uint32_t)coll__tagged_card(p->ep, mine.card);
  while (getrandom(&mine.token, sizeof mine.token, 0) != sizeof mine.token) continue;
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = sizeof mine / 4, .send = &mine, .recv = all};
  int rc = coll_run(c, &a);
  if (rc) snprintf(err, errlen, "the point-to-point cards: %s", coll_strerror(rc));
  p->token = (uint64_t)all[0].token << 32;
  for (int r = 0; r < c->size && rc == 0 && p->rc == 0; r++) {
    if (all[r].rc) {
      p->rc = all[r].rc;
      snprintf(p->why, sizeof p->why, "rank %d has no point-to-point endpoint: %.*s", r, (int)sizeof all[r].error,
               all[r].error);
    } else if (p->ep) { /* else this rank's own failure comes at r == rank */
      char text[COLL__NODES_TEXT - 48];
      if ((p->rc = coll__tagged_add(p->ep, all[r].card, all[r].len, text, sizeof text)) != 0)
        snprintf(p->why, sizeof p->why, "rank %d's point-to-point address: %s", r, text);
    }
  }
  free(all);
  if (rc) {
    coll__tagged_close(p->ep);
    pthread_mutex_lock(&p->lock);
    sp_unref(p);
    return rc;
  }
  if (p->rc) coll__tagged_close(p->ep), p->ep = NULL;
  *p_p = p;
  return 0;
}

/* ---- operations (the lock held) ---- */
static void sp_live_remove(coll__span_p2p_t *p, sp_op_t *op) {
  if (!op->request) return;
  if (op->lprev) op->lprev->lnext = op->lnext;
  else if (p->live == op) p->live = op->lnext;
  if (op->lnext) op->lnext->lprev = op->lprev;
  op->lprev = op->lnext = NULL;
}

static void sp_finish(coll__span_p2p_t *p, sp_op_t *op, int result) {
  op->result = result;
  op->done = 1;
  sp_live_remove(p, op);
}

/* An operation its caller is done with: freed, unless the provider still holds it (posted, no
 * completion yet: a send or receive given up when the communicator failed), whose completion
 * would write into it; then it waits among the orphans. */
static void sp_release(coll__span_p2p_t *p, sp_op_t *op) {
  if (op->posted && !op->t.done && p->ep) {
    op->onext = p->orphans;
    p->orphans = op;
  } else {
    free(op);
  }
}

/* The endpoint closes: what was in flight is dropped, no buffer is touched after this. */
static void sp_close_endpoint(coll__span_p2p_t *p) {
  coll__tagged_close(p->ep);
  p->ep = NULL;
  while (p->orphans) {
    sp_op_t *o = p->orphans;
    p->orphans = o->onext;
    free(o);
  }
}

/* The communicator's failure (a lost node or rank, any failed call), 0 while it goes on. */
static int sp_failed(coll__span_p2p_t *p) {
  if (p->c == NULL) return COLL_EABORTED;
  return coll__span_error(p->c, NULL);
}

static int sp_fail(coll__span_p2p_t *p, int code, const char *fmt, const char *what) {
  char text[COLL__NODES_TEXT];
  snprintf(text, sizeof text, fmt, p->c->rank, what);
  coll__span_fail(p->c, code, text);
  return code;
}

/* Done? Takes what the provider said once it said it. An operation that failed (a connection that
 * broke) fails the communicator, as a failed collective does. */
static int sp_settled(sp_op_t *op) {
  if (op->done || !op->t.done) return op->done;
  int rc = op->t.rc;
  if (!op->send && (rc == 0 || rc == COLL_EMISMATCH))
    op->status = (coll_status_t){.source = op->t.source, .tag = (int)(op->t.tag & 0x7fffffff), .bytes = op->t.bytes};
  coll__span_p2p_t *p = op->p;
  int peer = op->send ? op->peer : op->t.source;
  if ((rc == 0 || rc == COLL_EMISMATCH) && peer >= 0 && peer < p->size && !p->contacted[peer])
    p->contacted[peer] = 1, p->uncontacted--;
  if (rc != 0 && rc != COLL_EMISMATCH && rc != -ECANCELED && op->p->c && sp_failed(op->p) == 0)
    sp_fail(op->p, rc, "rank %d: a point-to-point operation between nodes failed (%s); the communicator is closed",
            coll_strerror(rc));
  sp_finish(op->p, op, rc);
  return 1;
}

/* Post op now: 0, -EAGAIN, or a failure (which fails the communicator). */
static int sp_post(coll__span_p2p_t *p, sp_op_t *op) {
  char err[COLL__NODES_TEXT] = "";
  uint64_t tag = p->token | (op->tag < 0 ? 0 : (uint64_t)op->tag);
  int rc = op->send ? coll__tagged_send(p->ep, op->buf, op->bytes, op->peer, p->c->rank, tag, &op->t, err, sizeof err)
                    : coll__tagged_recv(p->ep, (void *)op->buf, op->bytes, op->peer, tag,
                                        op->tag == COLL_ANY_TAG ? SP_TAG_BITS : 0, &op->t, err, sizeof err);
  if (rc == 0) op->posted = 1;
  else if (rc != -EAGAIN) sp_fail(p, rc, "rank %d could not post a point-to-point operation: %s", err);
  return rc;
}

/* Read completions, post what waits to be posted, in order: 0 or the communicator's failure. */
static int sp_progress(coll__span_p2p_t *p) {
  char err[COLL__NODES_TEXT] = "";
  if (p->ep == NULL || p->doomed) return p->c ? sp_failed(p) : COLL_EABORTED; /* dropped: it failed */
  int rc = coll__tagged_poll(p->ep, err, sizeof err);
  for (sp_op_t **at = &p->orphans; *at;) { /* what the provider is done with now */
    sp_op_t *o = *at;
    if (o->t.done) *at = o->onext, free(o);
    else at = &o->onext;
  }
  if (rc < 0) return sp_fail(p, rc, "rank %d: point-to-point between nodes failed: %s", err);
  if (rc > 0 && p->inside > 1) coll__tagged_signal(p->ep); /* another waiter's may be among them */
  if ((rc = sp_failed(p)) != 0) return rc; /* nothing more is posted on a failed communicator */
  while (p->qhead) {
    if ((rc = sp_post(p, p->qhead)) == -EAGAIN) return 0;
    if (rc) return rc;
    p->qhead = p->qhead->qnext;
    if (p->qhead == NULL) p->qtail = NULL;
  }
  return 0;
}

static int sp_enqueue(coll__span_p2p_t *p, sp_op_t *op) {
  int failed = sp_failed(p);
  if (failed) return failed; /* checked before the call too, but it may have failed since */
  if (p->qhead == NULL) {
    int rc = sp_post(p, op);
    if (rc != -EAGAIN) return rc;
  }
  op->qnext = NULL;
  if (p->qtail) p->qtail->qnext = op;
  else p->qhead = op;
  p->qtail = op;
  return 0;
}

static void sp_unqueue(coll__span_p2p_t *p, sp_op_t *op) {
  sp_op_t **at = &p->qhead, *prev = NULL;
  while (*at && *at != op) prev = *at, at = &(*at)->qnext;
  if (*at == NULL) return;
  *at = op->qnext;
  if (p->qtail == op) p->qtail = prev;
}

/* A peer of this node that died while we waited for it fails the communicator. */
static int sp_check_peer(coll__span_p2p_t *p, sp_op_t *op) {
  int local = op->peer >= 0 ? coll__span_local_of(p->c, op->peer) : -1;
  coll_comm_t *node = coll__comm_here(p->c);
  if (local < 0 || local == node->rank || coll__peer_gone(node, local) != 1) return 0;
  char what[96];
  snprintf(what, sizeof what, "%d died while rank %d waited to %s it", op->peer, p->c->rank,
           op->send ? "send to" : "receive from");
  return sp_fail(p, COLL_EPEERLOST, "rank %d: rank %s; the communicator is closed", what);
}

/* Until op is done (0), or -ETIMEDOUT at `until`, COLL_EINTERRUPTED (blocking only), the
 * communicator's failure, COLL_EABORTED when it is being freed. */
static int sp_wait(coll__span_p2p_t *p, sp_op_t *op, double until, int blocking) {
  if (p->c == NULL) return COLL_EABORTED;
  coll_comm_t *node = coll__comm_here(p->c);
  p->inside++;
  double start = sp_now(), next_check = start + SP_SLICE_S;
  if (op->first_wait == 0) op->first_wait = start;
  double since = start - 1; /* the bridge's wait: a stretch long begun, so it blocks at once (the spin is here) */
  double spin_until = coll__core_wanted(start) ? start : start + SP_SPIN_S; /* no spin where a task wants the core */
  int rc = 0;
  while (rc == 0 && !sp_settled(op)) {
    if ((rc = sp_failed(p)) != 0) break; /* first: the communicator may be gone */
    if ((rc = sp_progress(p)) != 0 || sp_settled(op)) break;
    double now = sp_now();
    if (now >= until) rc = -ETIMEDOUT;
    else if (now >= next_check) {
      next_check = now + SP_SLICE_S;
      coll_interrupt_fn fn = blocking ? node->interrupt_fn : NULL;
      void *arg = node->interrupt_arg;
      if (fn) { /* without the lock: Python's takes the GIL, which a caller of ours may hold */
        pthread_mutex_unlock(&p->lock);
        int stop = fn(arg);
        pthread_mutex_lock(&p->lock);
        if (p->c == NULL) rc = COLL_EABORTED;
        else if (stop) rc = COLL_EINTERRUPTED;
      }
      if (rc == 0 && !sp_settled(op)) rc = sp_check_peer(p, op);
    }
    if (rc) break;
    if (now < spin_until) {
      pthread_mutex_unlock(&p->lock);
      for (int k = 0; k < 16; k++) coll__relax();
      pthread_mutex_lock(&p->lock);
      if (sp_now() - now > SP_PREEMPTED_S) spin_until = 0;
      continue;
    }
    coll__tagged_t *ep = p->ep;
    int watch = coll__span_watch(p->c);
    /* rxm's connection handshake does not stir the CQ's fd (net_wait.c: Connections): short
     * slices while this wait may hang on one, on either side */
    int settling = now - op->first_wait < SP_SETTLING_FOR_S &&
                   (op->peer >= 0 && op->peer < p->size ? !p->contacted[op->peer] : p->uncontacted > 0);
    unsigned seen = coll__tagged_stirs(ep); /* after the last look at op, under the lock */
    pthread_mutex_unlock(&p->lock);
    int woke = coll__tagged_idle(ep, &since, until, settling ? SP_SETTLING_S : SP_SLICE_S, watch, seen);
    pthread_mutex_lock(&p->lock);
    if (woke == 2 && p->c && (rc = sp_failed(p)) == 0)
      rc = sp_fail(p, COLL_EPEERLOST, "rank %d: the connection to the job's other nodes closed (%s): a node went "
                   "away or the communicator failed there", op->send ? "sending" : "receiving");
  }
  if (--p->inside == 0) {
    if (p->doomed && p->ep) sp_close_endpoint(p); /* sp_drop_endpoint left it to the last waiter */
    pthread_cond_broadcast(&p->idle);
  }
  return sp_settled(op) ? 0 : rc;
}

static double sp_until(coll_comm_t *c, double timeout_s) {
  double until = timeout_s >= 0 ? sp_now() + timeout_s : INFINITY, limit = coll__span_timeout(c);
  if (limit > 0 && sp_now() + limit < until) until = sp_now() + limit;
  return until;
}

/* The communicator failed with an operation still in the provider's hands (a send under way, a
 * receive being filled), whose buffer its caller is about to get back. From now on nobody drives
 * the provider (doomed: tcp's progress is manual, so it moves no byte unless called), and the
 * endpoint closes now, or, where other threads are in their waits (the failure ends them within a
 * slice), as the last of them leaves: no thread waits here for another. */
static void sp_drop_endpoint(coll__span_p2p_t *p) {
  if (p->ep == NULL) return;
  p->doomed = 1;
  if (p->inside > 0) coll__tagged_signal(p->ep);
  else sp_close_endpoint(p);
}

/* A wait that ended in rc: withdraw op. A receive is cancelled (it may have matched meanwhile:
 * then it is done after all, 0); a send cannot be, and fails the communicator, as does a receive
 * still being filled; then the endpoint closes (sp_drop_endpoint) before the caller gets its buffer. */
static int sp_give_up(coll__span_p2p_t *p, sp_op_t *op, int rc) {
  if (!op->posted) {
    sp_unqueue(p, op);
    sp_finish(p, op, rc);
    return rc;
  }
  if (!op->send && p->ep && !p->doomed && coll__tagged_cancel(p->ep, &op->t) == 0) {
    double until = sp_now() + SP_CANCEL_S;
    while (!op->t.done && sp_now() < until) {
      char err[COLL__NODES_TEXT];
      if (coll__tagged_poll(p->ep, err, sizeof err) < 0) break;
    }
    if (!op->t.done && rc != COLL_EINTERRUPTED && p->c && sp_failed(p) == 0) /* matched: being filled */
      (void)sp_wait(p, op, sp_until(p->c, -1), 1);
    if (op->t.done && op->t.rc != -ECANCELED) return sp_settled(op), op->result; /* taken after all */
    if (op->t.done) {
      sp_finish(p, op, rc);
      return rc;
    }
  }
  if (p->c && sp_failed(p) == 0)
    sp_fail(p, rc == COLL_EINTERRUPTED ? COLL_EPEERLOST : rc, "rank %d gave up a point-to-point %s that was under "
            "way between nodes; the communicator is closed", op->send ? "send" : "receive");
  if (!op->t.done) sp_drop_endpoint(p);
  sp_finish(p, op, rc);
  return rc;
}

/* ---- the calls ---- */
static int sp_check(coll_comm_t *c, const void *buf, size_t bytes, int peer, int tag, int any, coll__span_p2p_t **p_p) {
  if (buf == NULL && bytes > 0) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (peer < (any ? COLL_ANY_SOURCE : 0) || peer >= c->size || tag < (any ? COLL_ANY_TAG : 0)) return COLL_EBADARG;
  int rc = coll__span_error(c, NULL);
  if (rc) return rc;
  coll__span_p2p_t *p = coll__span_p2p(c);
  if (p == NULL) return COLL_ENOTSUP;
  if (p->rc) {
    coll__span_note(c, p->why);
    return COLL_ENOTSUP;
  }
  *p_p = p;
  return 0;
}

/* A blocking call: its operation on the heap, as it may outlive the call (sp_release). */
static int sp_block(coll__span_p2p_t *p, const sp_op_t *tmpl, coll_status_t *status_p) {
  sp_op_t *op = malloc(sizeof *op);
  if (op == NULL) return -ENOMEM;
  *op = *tmpl;
  pthread_mutex_lock(&p->lock);
  op->p = p;
  int rc = p->c ? sp_enqueue(p, op) : COLL_EABORTED;
  if (rc == 0) rc = sp_wait(p, op, sp_until(p->c, -1), 1);
  rc = rc == 0 ? op->result : sp_give_up(p, op, rc);
  if ((rc == 0 || rc == COLL_EMISMATCH) && status_p) *status_p = op->status;
  sp_release(p, op);
  pthread_mutex_unlock(&p->lock);
  return rc;
}

int coll__span_send(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag) {
  coll__span_p2p_t *p = NULL;
  int rc = sp_check(c, buf, bytes, dest, tag, 0, &p);
  if (rc) return rc;
  sp_op_t op = {.send = 1, .peer = dest, .tag = tag, .buf = buf, .bytes = bytes};
  return sp_block(p, &op, NULL);
}

int coll__span_recv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_status_t *status_p) {
  coll__span_p2p_t *p = NULL;
  int rc = sp_check(c, buf, bytes, source, tag, 1, &p);
  if (rc) return rc;
  sp_op_t op = {.peer = source, .tag = tag, .buf = buf, .bytes = bytes};
  return sp_block(p, &op, status_p);
}

/* ---- requests ---- */
static int sp_req_wait(void *opv, double timeout_s) {
  sp_op_t *op = opv;
  coll__span_p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  int rc = sp_settled(op) ? 0 : sp_wait(p, op, p->c ? sp_until(p->c, timeout_s) : 0, 0);
  if (rc && rc != -ETIMEDOUT && !sp_settled(op)) sp_give_up(p, op, rc); /* the communicator failed: its result */
  if (sp_settled(op)) rc = op->result;
  pthread_mutex_unlock(&p->lock);
  return rc;
}

static int sp_req_test(void *opv, int *result_p) {
  sp_op_t *op = opv;
  coll__span_p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  if (!sp_settled(op) && p->c) {
    int rc = sp_failed(p);
    if (rc == 0) rc = sp_progress(p);
    if (rc && !sp_settled(op)) sp_give_up(p, op, rc);
  }
  int done = sp_settled(op);
  if (done && result_p) *result_p = op->result;
  pthread_mutex_unlock(&p->lock);
  return done;
}

static int sp_req_status(void *opv, coll_status_t *status_p) {
  sp_op_t *op = opv;
  pthread_mutex_lock(&op->p->lock);
  int ok = sp_settled(op) && !op->send;
  if (ok) *status_p = op->status;
  pthread_mutex_unlock(&op->p->lock);
  return ok ? 0 : COLL_EBADARG;
}

static int sp_req_cancel(void *opv) {
  sp_op_t *op = opv;
  coll__span_p2p_t *p = op->p;
  pthread_mutex_lock(&p->lock);
  int rc = -EBUSY;
  if (sp_settled(op)) {
    rc = -EALREADY;
  } else if (!op->send && !op->posted) {
    sp_unqueue(p, op);
    sp_finish(p, op, -ECANCELED);
    rc = 0;
  } else if (!op->send && p->ep && !p->doomed && coll__tagged_cancel(p->ep, &op->t) == 0) {
    double until = sp_now() + SP_CANCEL_S;
    char err[COLL__NODES_TEXT];
    while (!op->t.done && sp_now() < until && coll__tagged_poll(p->ep, err, sizeof err) >= 0) continue;
    rc = op->t.done && op->t.rc == -ECANCELED ? 0 : -EBUSY;
    sp_settled(op);
  }
  pthread_mutex_unlock(&p->lock);
  return rc;
}

/* Nobody will see the result and the buffer is about to go: a receive is withdrawn, else wait as
 * a blocking call does (the interrupt ends it, and then the send fails the communicator). */
static void sp_req_free(void *opv) {
  sp_op_t *op = opv;
  coll__span_p2p_t *p = op->p;
  sp_req_cancel(op);
  pthread_mutex_lock(&p->lock);
  while (!sp_settled(op)) {
    int rc = p->c ? sp_wait(p, op, sp_until(p->c, -1), 1) : COLL_EABORTED;
    if (rc) sp_give_up(p, op, rc); /* a timeout too: nobody waits for this one any more */
  }
  sp_release(p, op);
  sp_unref(p);
}

static const coll__req_ops_t sp_req_ops = {sp_req_wait, sp_req_test, sp_req_free, sp_req_status, sp_req_cancel};

static int sp_start(coll__span_p2p_t *p, const sp_op_t *tmpl, coll_req_t **req_p) {
  if (req_p == NULL) return COLL_EBADARG;
  sp_op_t *op = malloc(sizeof *op);
  coll_req_t *req = NULL;
  if (op == NULL || coll__req_wrap_p2p(op, &sp_req_ops, &req) != 0) {
    free(op);
    return -ENOMEM;
  }
  *op = *tmpl;
  op->request = 1, op->p = p;
  pthread_mutex_lock(&p->lock);
  int rc = p->c ? sp_enqueue(p, op) : COLL_EABORTED;
  if (rc) {
    pthread_mutex_unlock(&p->lock);
    free(op), free(req);
    return rc;
  }
  p->refs++;
  op->lnext = p->live;
  if (p->live) p->live->lprev = op;
  p->live = op;
  pthread_mutex_unlock(&p->lock);
  *req_p = req;
  return 0;
}

int coll__span_isend(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag, coll_req_t **req_p) {
  coll__span_p2p_t *p = NULL;
  int rc = sp_check(c, buf, bytes, dest, tag, 0, &p);
  if (rc) return rc;
  sp_op_t op = {.send = 1, .peer = dest, .tag = tag, .buf = buf, .bytes = bytes};
  return sp_start(p, &op, req_p);
}

int coll__span_irecv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_req_t **req_p) {
  coll__span_p2p_t *p = NULL;
  int rc = sp_check(c, buf, bytes, source, tag, 1, &p);
  if (rc) return rc;
  sp_op_t op = {.peer = source, .tag = tag, .buf = buf, .bytes = bytes};
  return sp_start(p, &op, req_p);
}

void coll__span_p2p_close(coll__span_p2p_t *p) {
  if (p == NULL) return;
  pthread_mutex_lock(&p->lock);
  p->c = NULL; /* waiters leave within a slice */
  while (p->inside > 0) pthread_cond_wait(&p->idle, &p->lock);
  while (p->live) sp_finish(p, p->live, COLL_EABORTED);
  p->qhead = p->qtail = NULL;
  sp_close_endpoint(p);
  sp_unref(p);
}
