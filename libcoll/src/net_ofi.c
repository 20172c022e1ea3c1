/*
 * net_ofi.c - the bridge over libfabric (net.h): an RDM endpoint, one registered pool,
 * fi_writedata into the peers' pools with a 32-bit note as remote CQ data.
 *
 * What the providers differ in is decided from what fi_getinfo returns, not from names:
 *  - mr_mode: verbs and shm want virtual addresses and the keys they hand out
 *    (FI_MR_VIRT_ADDR, FI_MR_PROV_KEY), tcp returns an empty mr_mode (offsets from the
 *    region's start, keys the application picks). The card carries base and key, and a
 *    write targets base + offset or the offset alone.
 *  - FI_RX_CQ_DATA: where remote CQ data consumes a posted receive (verbs), receives of no
 *    bytes are kept posted.
 *  - cq_data_size: at least the 4 bytes of a note, else the provider is refused.
 * Keys and notes' senders: net.h says what protects the pool and why (checked here).
 * Progress is manual on tcp: every call that waits reads the completion queue, and notes
 * that arrive while a flush waits for its own writes are queued for the next poll. Between
 * empty polls a wait spins a little, then blocks on the CQ's wait object (net_wait.c).
 *
 * Opening the endpoint, loading libfabric and adding peers are in net_ofi_open.c.
 */
#include "net_ofi.h"
#ifdef COLL_NET_OFI

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "coll.h"

void coll__net_set_timeout(coll__net_t *n, double timeout_s) { n->timeout_s = timeout_s > 0 ? timeout_s : 0; }

void coll__net_watch(coll__net_t *n, int fd, const char *what) {
  n->watch_fd = fd;
  snprintf(n->watch_what, sizeof n->watch_what, "%s", what ? what : "another node");
}

/* COLL_EPEERLOST once the watched connection has closed (end of file or an error: its
 * other end's process or node is gone); data waiting on it is its owner's, not a loss. */
static int net_watch_check(coll__net_t *n, char *err, size_t errlen) {
  if (n->watch_fd < 0 || (!n->watch_due && ++n->idle % 1024)) return 0;
  n->watch_due = 0;
  struct pollfd p = {.fd = n->watch_fd, .events = POLLIN};
  if (poll(&p, 1, 0) <= 0) return 0;
  if (!(p.revents & (POLLHUP | POLLERR | POLLNVAL))) {
    char c;
    ssize_t got = recv(n->watch_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) return 0;
  }
  snprintf(err, errlen, "the connection to %s closed: a node of the job went away", n->watch_what);
  return COLL_EPEERLOST;
}

/* A note refused (from an address that is no peer, or a message with bytes): counted, and said
 * once on stderr, as the library warns (HBMCOLL_LOG=warn, the default). */
static void net_drop(coll__net_t *n, const char *why) {
  if (n->dropped++ == 0) {
    char line[320];
    int len = snprintf(line, sizeof line, "hbmcoll: the bridge (%s) dropped a note %s; such notes are counted "
                       "(Bridge.dropped()) and not said again\n", n->line, why);
    if (len > 0) {
      ssize_t w = write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1);
      (void)w; /* nowhere to report a failed warning */
    }
  }
}

/* The peer number of a message's source, or -1 when it is none of the peers added. */
static int net_peer_of(const coll__net_t *n, fi_addr_t src) {
  if (src == FI_ADDR_NOTAVAIL || src == FI_ADDR_UNSPEC) return -1;
  if (src < (fi_addr_t)n->npeers && n->peers[src].addr == src) return (int)src; /* FI_AV_TABLE: in order */
  for (int k = 0; k < n->npeers; k++)
    if (n->peers[k].addr == src) return k;
  return -1;
}

/* One completion: a peer's note (1, *peer_p its sender or -1: see the top), my write done (0),
 * nothing (0), a note refused (0, counted), or a failure. */
static int net_read_one(coll__net_t *n, uint32_t *note_p, int *peer_p, char *err, size_t errlen) {
  struct fi_cq_data_entry e;
  fi_addr_t src = FI_ADDR_NOTAVAIL;
  ssize_t got = n->source ? fi_cq_readfrom(n->cq, &e, 1, &src) : fi_cq_read(n->cq, &e, 1);
  if (got == -FI_EAGAIN || got == 0) return 0;
  if (got == -FI_EAVAIL) {
    struct fi_cq_err_entry ee = {0};
    fi_cq_readerr(n->cq, &ee, 0);
    if (ee.flags & FI_RECV) { /* a message that did not fit our empty receives: not one of ours */
      int rc = coll__net_post_receives(n, 1);
      if (rc) return coll__net_fail(err, errlen, rc, "fi_recv");
      net_drop(n, "that carried bytes (a message from outside the job)");
      return 0;
    }
    if (coll__net_broken(ee.err)) return coll__net_fail(err, errlen, ee.err, "a network transfer");
    snprintf(err, errlen, "a network transfer failed: %s (%s)", coll__net_fi.strerror(ee.err),
             fi_cq_strerror(n->cq, ee.prov_errno, ee.err_data, NULL, 0));
    return ee.err ? -ee.err : -EIO;
  }
  if (got < 0) return coll__net_fail(err, errlen, (int)got, "fi_cq_read");
  n->settled = 1;
  int message = (e.flags & FI_RECV) && !(e.flags & FI_REMOTE_WRITE);
  if (message || (n->rx_cq_data && (e.flags & FI_REMOTE_CQ_DATA))) { /* it took one of our receives */
    int rc = coll__net_post_receives(n, 1);
    if (rc) return coll__net_fail(err, errlen, rc, "fi_recv");
  }
  if (message) {
    int peer = n->source ? net_peer_of(n, src) : -1;
    if ((n->source && peer < 0) || !(e.flags & FI_REMOTE_CQ_DATA) || e.len) {
      net_drop(n, peer < 0 ? "from an address that is no peer of this endpoint" : "that was no note");
      return 0;
    }
    *note_p = (uint32_t)e.data, *peer_p = peer;
    return 1;
  }
  if (e.flags & FI_REMOTE_CQ_DATA) {
    *note_p = (uint32_t)e.data, *peer_p = -1;
    return 1;
  }
  if (e.flags & FI_WRITE) {
    n->completed++;
    if (e.op_context) ++*(uint64_t *)e.op_context;
  }
  return 0;
}

static int net_queue(coll__net_t *n, uint32_t note, int peer) {
  if (n->qhead == n->nqueued) n->qhead = n->nqueued = 0;
  if (n->nqueued == n->qcap) {
    size_t cap = n->qcap ? 2 * n->qcap : 64;
    net_note_t *q = realloc(n->queued, cap * sizeof *q);
    if (q == NULL) return -ENOMEM;
    n->queued = q, n->qcap = cap;
  }
  n->queued[n->nqueued++] = (net_note_t){note, peer};
  return 0;
}

/* One step of a wait inside this layer (a write's retries, a flush): the lost-node watch, one
 * completion (a note kept for the next poll), else idling (coll__net_idle; *since: when the
 * empty stretch began), the interrupt and the time limit (`late` says what ran out of it). 0 to
 * go on, or the failure. */
static int net_step(coll__net_t *n, double until, unsigned spins, double *since, const char *late, char *err,
                    size_t errlen) {
  int rc = net_watch_check(n, err, errlen);
  if (rc) return rc;
  uint32_t got;
  int peer;
  rc = net_read_one(n, &got, &peer, err, errlen);
  if (rc == 1) return *since = 0, net_queue(n, got, peer);
  if (rc) return rc;
  int slept = coll__net_idle(n, since, until);
  if ((slept || (spins & 255) == 0) && coll__net_interrupted(n)) {
    snprintf(err, errlen, "interrupted by a signal while waiting on another node's rank");
    return COLL_EINTERRUPTED;
  }
  if (until > 0 && (slept || (spins & 1023) == 0) && coll__net_now() > until) {
    snprintf(err, errlen, "%s in %.0f s", late, n->timeout_s);
    return -ETIMEDOUT;
  }
  return 0;
}

/* How a write goes: with its note, injected with its note (no completion), or with the note as a
 * message of no bytes behind it, which names me to the peer. */
enum { NET_NOTED, NET_INJECTED, NET_SOURCED };
static const char *const net_post_call[] = {"fi_writedata", "fi_inject_writedata", "fi_write"};

/* Post one write from src (desc: its registration, NULL where the provider needs none), `how`
 * as above. */
static int net_post(coll__net_t *n, int peer, const void *src, void *desc, size_t to, size_t len,
                    uint32_t note, int how, uint64_t *sent_p, char *err, size_t errlen) {
  const net_peer_t *p = &n->peers[peer];
  double until = n->timeout_s ? coll__net_now() + n->timeout_s : 0, since = 0;
  int sourced = how == NET_SOURCED;
  for (unsigned spins = 1;; spins++) {
    ssize_t rc = sourced ? fi_write(n->ep, src, len, desc, p->addr, p->base + to, p->key, sent_p)
                 : how == NET_INJECTED ? fi_inject_writedata(n->ep, src, len, note, p->addr, p->base + to, p->key)
                 : fi_writedata(n->ep, src, len, desc, note, p->addr, p->base + to, p->key, sent_p);
    if (rc == 0) break;
    if (rc != -FI_EAGAIN) return coll__net_fail(err, errlen, (int)rc, net_post_call[how]);
    /* the provider wants progress (rxm connects on demand); it retries a peer that went away
     * for ever, hence the watch and the limit */
    int r = net_step(n, until, spins, &since, "a write to another node's rank found no way through", err, errlen);
    if (r) return r;
  }
  if (how == NET_INJECTED) return 0; /* no completion will come */
  n->posted++;
  if (!sourced) return 0;
  if (!n->saw) { /* the note could overtake the bytes: it leaves once they are there */
    int r = coll__net_flush(n, err, errlen);
    if (r) return r;
  }
  since = 0;
  for (unsigned spins = 1;; spins++) {
    ssize_t rc = fi_injectdata(n->ep, NULL, 0, note, p->addr);
    if (rc == 0) return 0;
    if (rc != -FI_EAGAIN) return coll__net_fail(err, errlen, (int)rc, "fi_injectdata (a note)");
    int r = net_step(n, until, spins, &since, "a note to another node's rank found no way through", err, errlen);
    if (r) return r;
  }
}

int coll__net_write(coll__net_t *n, int peer, size_t from, size_t to, size_t len, uint32_t note,
                    uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || from + len > n->pool_bytes || len > n->pool_bytes)
    return COLL_EBADARG;
  return net_post(n, peer, n->pool + from, n->desc, to, len, note, NET_NOTED, sent_p, err, errlen);
}

size_t coll__net_inject_max(const coll__net_t *n) { return n->inject; }

int coll__net_inject(coll__net_t *n, int peer, size_t from, size_t to, size_t len, uint32_t note, char *err,
                     size_t errlen) {
  if (peer < 0 || peer >= n->npeers || from + len > n->pool_bytes || len > n->inject) return COLL_EBADARG;
  return net_post(n, peer, n->pool + from, n->desc, to, len, note, NET_INJECTED, NULL, err, errlen);
}

int coll__net_write_sourced(coll__net_t *n, int peer, size_t from, size_t to, size_t len, uint32_t note,
                            uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || from + len > n->pool_bytes || len > n->pool_bytes)
    return COLL_EBADARG;
  return net_post(n, peer, n->pool + from, n->desc, to, len, note, NET_SOURCED, sent_p, err, errlen);
}

uint64_t coll__net_dropped(const coll__net_t *n) { return n->dropped; }

int coll__net_any_source(const coll__net_t *n) { return !n->mr_local; }

void coll__net_set_interrupt(coll__net_t *n, int (*fn)(void *), void *arg) {
  n->interrupt_fn = fn, n->interrupt_arg = arg;
}

int coll__net_interrupted(coll__net_t *n) {
  if (n->interrupt_fn == NULL) return 0;
  double now = coll__net_now();
  if (now < n->next_interrupt_check) return 0;
  n->next_interrupt_check = now + NET_INTERRUPT_S;
  return n->interrupt_fn(n->interrupt_arg) != 0;
}

int coll__net_write_from(coll__net_t *n, int peer, const void *src, size_t len, size_t to, uint32_t note,
                         uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || n->mr_local || len > n->pool_bytes) return COLL_EBADARG;
  return net_post(n, peer, src, NULL, to, len, note, NET_NOTED, sent_p, err, errlen);
}

int coll__net_flush(coll__net_t *n, char *err, size_t errlen) {
  double until = n->timeout_s ? coll__net_now() + n->timeout_s : 0, since = 0;
  for (unsigned spins = 1; n->completed < n->posted; spins++) {
    int r = net_step(n, until, spins, &since, "writes to another node's rank did not complete", err, errlen);
    if (r) return r;
  }
  return 0;
}

int coll__net_poll_from(coll__net_t *n, uint32_t *note_p, int *peer_p, char *err, size_t errlen) {
  if (n->qhead < n->nqueued) {
    *note_p = n->queued[n->qhead].note, *peer_p = n->queued[n->qhead].peer;
    n->qhead++;
    return 1;
  }
  int rc = net_read_one(n, note_p, peer_p, err, errlen);
  return rc == 0 ? net_watch_check(n, err, errlen) : rc;
}

int coll__net_idle_fds(coll__net_t *n, double *since, double until, struct pollfd *extra, int nextra) {
  double most = n->settled ? NET_INTERRUPT_S : NET_SETTLING_S; /* net_wait.c: Connections */
  int rc = coll__net_waiter_idle(&n->waiter, since, until, most, n->watch_fd, extra, nextra, NULL);
  if (rc == 2) n->watch_due = 1;
  return rc != 0;
}

void coll__net_wait_counts(const coll__net_t *n, uint64_t *blocks_p, uint64_t *woken_p) {
  *blocks_p = n->waiter.blocks, *woken_p = n->waiter.woken;
}

int coll__net_idle(coll__net_t *n, double *since, double until) { return coll__net_idle_fds(n, since, until, NULL, 0); }

int coll__net_poll(coll__net_t *n, uint32_t *note_p, char *err, size_t errlen) {
  int peer;
  return coll__net_poll_from(n, note_p, &peer, err, errlen);
}
#endif /* COLL_NET_OFI */
