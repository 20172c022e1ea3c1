/*
 * nodes_comm.c - a coll_comm_t that spans nodes: the job's rank and size over the parts it owns,
 * the node's communicator (shared memory), this rank's bridge endpoint and ring (if it carries
 * one), the connections that notice a lost node (nodes_watch.c), and the layer that composes them
 * (hier.h). The public functions hand such a communicator here (c->span); it has no segment of its
 * own: its arena is the node's.
 *
 * Calls run in call order on every rank: started ones on the layer's request engine (request.c's,
 * coll__hier_start), a blocking one in the caller's thread, or behind the started ones when any
 * are queued. Any failure but a disagreement (COLL_EMISMATCH) or a bad argument ends the job's
 * communicator on every rank: the layer fails the node's communicator with the reason and shuts
 * the watched connection, so the other nodes' waits end with COLL_EPEERLOST.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll_internal.h"
#include "nodes.h"

struct coll__span {
  coll_comm_t *node;
  coll__net_t *net;
  coll__net_ring_t *ring;
  coll__nodes_watch_t *watch;
  coll__hier_t *hier;
  coll__span_p2p_t *p2p; /* point-to-point (nodes_p2p.c) */
  int watch_dup;     /* a split's duplicate of its parent's watched fd (closed here), -1 none */
  char iface[64];    /* what a split opens its endpoints on ("" the provider's first) */
  int family;
  size_t pool_bytes;
  double timeout_s;
  char text[COLL__NODES_TEXT]; /* the sentence of the last disagreement or bad argument */
  char why[COLL__NODES_TEXT];  /* what a lost peer meant: a node that left before this call */
};

/* The fd the layer shuts on a failure and the bridge watches: the rendezvous' or the parent's. */
static int span_watch_fd(const coll__span_t *s) {
  return s->watch ? coll__nodes_watch_fd(s->watch) : s->watch_dup;
}

const char *coll__span_iface(const coll_comm_t *c) { return c->span->iface[0] ? c->span->iface : NULL; }
int coll__span_family(const coll_comm_t *c) { return c->span->family; }
size_t coll__span_pool_bytes(const coll_comm_t *c) { return c->span->pool_bytes; }
double coll__span_timeout(const coll_comm_t *c) { return c->span->timeout_s; }
int coll__span_node_index(const coll_comm_t *c) { return c->span->hier->cfg.node; }
void coll__span_layout(const coll_comm_t *c, int *node_p, int *nodes_p, int *rings_p, const int **node_of_p,
                       const int **local_of_p) {
  const coll__hier_t *h = c->span->hier;
  *node_p = h->cfg.node, *nodes_p = h->cfg.nodes, *rings_p = h->cfg.rings;
  *node_of_p = h->node_of, *local_of_p = h->local_of;
}
const char *coll__span_describe(const coll_comm_t *c) {
  return c->span->net ? coll__net_describe(c->span->net) : "no bridge endpoint (beyond the rings)";
}
void coll__span_fail(coll_comm_t *c, int code, const char *text) { coll__hier_fail(c->span->hier, code, text); }
coll__span_p2p_t *coll__span_p2p(const coll_comm_t *c) { return c->span->p2p; }
int coll__span_watch(const coll_comm_t *c) { return span_watch_fd(c->span); }
void coll__span_note(coll_comm_t *c, const char *text) { snprintf(c->span->text, sizeof c->span->text, "%s", text); }
int coll__span_local_of(const coll_comm_t *c, int rank) {
  const coll__hier_t *h = c->span->hier;
  return h->node_of[rank] == h->cfg.node ? h->local_of[rank] : -1;
}

coll_comm_t *coll__comm_here(const coll_comm_t *c) {
  return c && c->span ? c->span->node : (coll_comm_t *)c;
}

/* The watch's guard: a rank of this node that died without leaving ends the job's communicator at
 * once, so the other nodes' waits (point-to-point ones too) end even while none of this node's ranks
 * is in a call to notice it. */
static int span_guard(void *arg) {
  coll__span_t *s = arg;
  coll_comm_t *node = s->node;
  for (int r = 0; r < node->size; r++) {
    if (r == node->rank || coll__peer_gone(node, r) != 1 || atomic_load(&node->ctl[r].left)) continue;
    const coll__hier_t *h = s->hier;
    char text[160];
    snprintf(text, sizeof text, "rank %d (local rank %d of node %d) died; the communicator is closed",
             h->rank_at[h->cfg.node * h->widest + r], r, h->cfg.node);
    coll__hier_fail(s->hier, COLL_EPEERLOST, text);
    return 1;
  }
  return 0;
}

static void span_parts_free(coll__span_t *s, int graceful) {
  coll__nodes_watch_guard(s->watch, NULL, NULL); /* first: it reads the parts freed below */
  coll__span_p2p_close(s->p2p);
  coll__hier_free(s->hier); /* its request engine first: queued requests end with COLL_EABORTED */
  if (graceful) coll__nodes_watch_close(s->watch, 60); /* the other nodes' writes to us completed */
  else coll__nodes_watch_abort(s->watch);
  if (graceful && s->watch == NULL && s->ring) { /* a split's ring: the goodbye stands for the watch's */
    char err[COLL__NODES_TEXT];
    (void)coll__net_ring_goodbye(s->ring, s->timeout_s > 0 && s->timeout_s < 60 ? s->timeout_s : 60, err, sizeof err);
  }
  coll__net_ring_free(s->ring);
  coll__net_close(s->net);
  coll_comm_free(s->node);
  if (s->watch_dup >= 0) close(s->watch_dup);
  free(s);
}

coll_comm_t *coll__comm_failed(int rank, int size, int code, const char *text) {
  coll_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->rank = rank, c->size = size, c->fd = -1;
  c->owner_pid = getpid();
  c->owner_epoch = atomic_load(&coll__fork_epoch);
  c->error = code;
  snprintf(c->error_text, sizeof c->error_text, "%s", text && *text ? text : coll_strerror(code));
  return c;
}

int coll__comm_span(const coll__span_config_t *cfg, coll_comm_t **comm_p, char *err, size_t errlen) {
  coll__span_t *s = calloc(1, sizeof *s);
  coll_comm_t *c = calloc(1, sizeof *c);
  int rc = s && c ? 0 : -ENOMEM;
  if (s) {
    *s = (coll__span_t){.node = cfg->local, .net = cfg->net, .ring = cfg->ring, .watch = cfg->watch, .watch_dup = -1,
                        .family = cfg->family, .pool_bytes = cfg->pool_bytes, .timeout_s = cfg->timeout_s};
    snprintf(s->iface, sizeof s->iface, "%s", cfg->iface ? cfg->iface : "");
    int parent_fd = cfg->parent ? span_watch_fd(cfg->parent->span) : -1;
    if (parent_fd >= 0 && (s->watch_dup = fcntl(parent_fd, F_DUPFD_CLOEXEC, 0)) < 0) rc = -errno;
  }
  if (rc == 0) {
    coll__hier_config_t h = {.local = cfg->local, .ring = cfg->nodes > 1 ? cfg->ring : NULL, .nodes = cfg->nodes,
                             .node = cfg->node, .rings = cfg->rings, .size = cfg->size, .node_of = cfg->node_of,
                             .local_of = cfg->local_of, .timeout_s = cfg->timeout_s, .watch_fd = span_watch_fd(s)};
    rc = coll__hier_make(&h, &s->hier, err, errlen);
  } else {
    snprintf(err, errlen, "out of memory for the communicator across nodes");
  }
  if (rc) {
    if (s) span_parts_free(s, 0);
    else coll__nodes_watch_abort(cfg->watch), coll__net_ring_free(cfg->ring), coll__net_close(cfg->net),
         coll_comm_free(cfg->local);
    free(c);
    return rc;
  }
  c->rank = coll__hier_rank(s->hier), c->size = cfg->size, c->fd = -1;
  c->owner_pid = cfg->local->owner_pid, c->owner_epoch = cfg->local->owner_epoch;
  c->params = cfg->local->params;
  c->span = s;
  if (s->net) coll__net_set_interrupt(s->net, cfg->local->interrupt_fn, cfg->local->interrupt_arg);
  if (s->net && span_watch_fd(s) >= 0) coll__net_watch(s->net, span_watch_fd(s), "the job's other nodes");
  coll__nodes_watch_guard(s->watch, span_guard, s);
  if ((rc = coll__span_p2p_open(c, &s->p2p, err, errlen)) != 0) { /* collective: the cards */
    span_parts_free(s, 0);
    free(c);
    return rc;
  }
  *comm_p = c;
  return 0;
}

/* A call's end: a disagreement's or a bad argument's sentence is kept for coll_comm_error (the
 * communicator goes on); any other failure ended it in hier.c already. */
static int span_note(coll__span_t *s, int rc, const char *err) {
  if ((rc == COLL_EMISMATCH || rc == COLL_EBADARG) && err[0]) snprintf(s->text, sizeof s->text, "%s", err);
  return rc;
}

/* A split's parent ended (its watched connection reached end of file, or failed)? */
static int span_parent_ended(const coll__span_t *s) {
  if (s->watch || s->watch_dup < 0) return 0;
  struct pollfd p = {.fd = s->watch_dup, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0) return 0;
  char byte;
  return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) || recv(s->watch_dup, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* The watch counts calls: a call made after another node's ranks closed never completes. A split
 * has no watch of its own: it ends with its parent. */
static int span_began(coll_comm_t *c, char *err, size_t errlen) {
  int rc = coll__nodes_watch_began(c->span->watch, err, errlen);
  if (rc == 0 && span_parent_ended(c->span))
    rc = COLL_EPEERLOST, snprintf(err, errlen, "the communicator this one was split from ended: a node or rank of "
                                  "the job was lost or failed");
  if (rc) coll__hier_fail(c->span->hier, rc, err);
  return rc;
}

/* Wait for a queued call in slices, so the interrupt check still ends a blocking call. */
static int span_wait(coll_comm_t *c, coll_req_t *r) {
  coll_comm_t *node = c->span->node;
  int rc;
  while ((rc = coll_req_wait(r, 0.05)) == -ETIMEDOUT && !coll_req_test(r, NULL)) {
    if (node->interrupt_fn && node->interrupt_fn(node->interrupt_arg)) {
      char text[96];
      snprintf(text, sizeof text, "rank %d was interrupted by a signal; the communicator is closed", c->rank);
      coll__hier_fail(c->span->hier, COLL_EINTERRUPTED, text);
      coll_req_wait(r, -1);
      return COLL_EINTERRUPTED;
    }
  }
  if (coll_req_test(r, &rc) != 1) rc = coll_req_wait(r, -1);
  return rc;
}

int coll__span_run(coll_comm_t *c, const coll_args_t *a) {
  coll__span_t *s = c->span;
  char err[COLL__NODES_TEXT] = "";
  int rc = span_began(c, err, sizeof err);
  if (rc) return rc;
  if (coll__hier_pending(s->hier)) { /* behind the started calls, on the engine */
    coll_req_t *r = NULL;
    rc = coll__hier_start(s->hier, a, &r, err, sizeof err);
    if (rc == 0) {
      rc = span_wait(c, r);
      coll_req_free(r);
    }
  } else {
    s->node->allow_interrupt = 1;
    rc = coll__hier_run(s->hier, a, err, sizeof err);
    s->node->allow_interrupt = 0;
  }
  return span_note(s, rc, err);
}

int coll__span_start(coll_comm_t *c, const coll_args_t *a, coll_req_t **req_p) {
  char err[COLL__NODES_TEXT] = "";
  int rc = span_began(c, err, sizeof err);
  if (rc == 0) rc = coll__hier_start(c->span->hier, a, req_p, err, sizeof err);
  return span_note(c->span, rc, err);
}

int coll__span_settle(coll_comm_t *c) {
  /* every call's arguments were met before any data moved: nothing is left unchecked, only the
   * started calls to let finish */
  while (coll__hier_pending(c->span->hier)) {
    struct timespec nap = {0, 1000000};
    nanosleep(&nap, NULL);
  }
  return coll__hier_failure(c->span->hier, NULL);
}

coll_comm_t *coll__span_free_but_node(coll_comm_t *c) {
  coll__span_t *s = c->span;
  coll_comm_t *node = s->node;
  if (coll__forked(c)) { /* the parent's threads are not in this process: release only ours */
    free(s), free(c);
    return node;
  }
  int failed = coll__hier_failure(s->hier, NULL) != 0 || c->error != 0;
  s->node = NULL; /* spared by span_parts_free; the layer above it goes first */
  span_parts_free(s, !failed);
  free(c);
  return node;
}

void coll__span_free(coll_comm_t *c) {
  coll_comm_free(coll__span_free_but_node(c)); /* the node's communicator last, as its arena held the pools */
}

void coll__span_leave(coll_comm_t *c) {
  coll_comm_leave(c->span->node);
  if (c->error == 0) {
    c->error = COLL_EABORTED;
    snprintf(c->error_text, sizeof c->error_text, "this rank closed the communicator");
  }
}

void coll__span_abort(coll_comm_t *c, int reason) {
  char text[96];
  if (reason == COLL_EPEERLOST)
    snprintf(text, sizeof text, "rank %d lost a peer it depends on and ended the communicator", c->rank);
  else
    snprintf(text, sizeof text, "rank %d aborted the communicator", c->rank);
  coll__hier_fail(c->span->hier, reason, text);
}

void coll__span_keep_text(coll_comm_t *c, const char *text) {
  snprintf(c->span->text, sizeof c->span->text, "%s", text);
}

int coll__span_error(const coll_comm_t *c, const char **text_p) {
  const char *text = NULL;
  int rc = coll__hier_failure(c->span->hier, &text);
  if (rc == 0 && c->error) rc = c->error, text = c->error_text;
  if (rc == 0) text = c->span->text;
  else if (rc == COLL_EPEERLOST && coll__nodes_watch_why(c->span->watch, c->span->why, sizeof c->span->why))
    text = c->span->why; /* not "a node went away": it left, as its program ended before this call */
  if (text_p) *text_p = text;
  return rc;
}

const char *coll__span_algorithm(const coll_comm_t *c) { return coll__hier_algorithm(c->span->hier); }

void coll__span_set_interrupt(coll_comm_t *c, coll_interrupt_fn fn, void *arg) {
  coll_comm_set_interrupt(c->span->node, fn, arg);
  if (c->span->net) coll__net_set_interrupt(c->span->net, fn, arg);
}
