/*
 * net_tagged.c - tagged messages over libfabric (net_tagged.h): an RDM endpoint with FI_TAGGED and
 * FI_DIRECTED_RECV, its completion queue (tagged format, a wait fd for the waits of net_wait.c),
 * and an address vector whose index is the peer's rank. libfabric is loaded and the provider entry
 * picked as for the bridge's endpoint (net_ofi_open.c); nothing is registered (rxm registers what
 * its rendezvous needs itself).
 */
#include "net_tagged.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll.h"

#ifdef COLL_NET_OFI
#include <rdma/fi_tagged.h>

#include "net_ofi.h"

#define TAGGED_RANK_BITS 24 /* a rank in the remote CQ data, the message's length above it */
#define TAGGED_RANK_MASK ((UINT64_C(1) << TAGGED_RANK_BITS) - 1)

struct coll__tagged {
  struct fi_info *info;
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  coll__net_waiter_t waiter;
  fi_addr_t *peers;
  int npeers, cap;
  int source;       /* FI_SOURCE: a completion names the sender's address */
  int long_data;    /* 8 bytes of remote CQ data: a message's length rides above its sender's rank */
  uint64_t dropped; /* strangers' messages */
  char line[200];
};

static int tagged_parts(coll__tagged_t *t, char *err, size_t errlen) {
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_TAGGED, .wait_obj = COLL_NET_WAIT_OBJ};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  int rc;
  if ((rc = coll__net_fi.fabric(t->info->fabric_attr, &t->fabric, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_fabric");
  if ((rc = fi_domain(t->fabric, t->info, &t->domain, NULL)) != 0) return coll__net_fail(err, errlen, rc, "fi_domain");
  if ((rc = fi_cq_open(t->domain, &cq_attr, &t->cq, NULL)) != 0) {
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(t->domain, &cq_attr, &t->cq, NULL)) != 0) return coll__net_fail(err, errlen, rc, "fi_cq_open");
  }
  coll__net_waiter_open(&t->waiter, t->fabric, t->cq, cq_attr.wait_obj);
  if ((rc = fi_av_open(t->domain, &av_attr, &t->av, NULL)) != 0) return coll__net_fail(err, errlen, rc, "fi_av_open");
  if ((rc = fi_endpoint(t->domain, t->info, &t->ep, NULL)) != 0) return coll__net_fail(err, errlen, rc, "fi_endpoint");
  if ((rc = fi_ep_bind(t->ep, &t->av->fid, 0)) != 0 || (rc = fi_ep_bind(t->ep, &t->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_ep_bind");
  if ((rc = fi_enable(t->ep)) != 0) return coll__net_fail(err, errlen, rc, "fi_enable");
  t->source = (t->info->caps & FI_SOURCE) != 0;
  t->long_data = t->info->domain_attr->cq_data_size >= 8;
  return 0;
}

typedef struct {
  const char *iface;
  int family;
  coll__tagged_t **t_p;
  char *err;
  size_t errlen;
} tagged_open_args_t;

static int tagged_open(void *arg) {
  tagged_open_args_t *a = arg;
  char *err = a->err;
  size_t errlen = a->errlen;
  int rc = coll__net_load(err, errlen);
  if (rc) return rc;
  struct fi_info *hints = coll__net_fi.dupinfo(NULL), *list = NULL;
  coll__tagged_t *t = calloc(1, sizeof *t);
  rc = hints && t ? 0 : -ENOMEM;
  if (rc == 0) {
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_CONTEXT | FI_CONTEXT2;
    hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_SAFE;
    /* messages between a pair match in the order sent (MPI's non-overtaking): asked of the provider,
     * not left to how rxm happens to use one connection per pair */
    hints->tx_attr->msg_order = hints->rx_attr->msg_order = FI_ORDER_SAS;
    if (a->iface && (hints->domain_attr->name = strdup(a->iface)) == NULL) rc = -ENOMEM;
  }
  for (int v = 0; rc == 0 && v < 2; v++) { /* the senders' addresses where the provider has them */
    hints->caps = FI_TAGGED | FI_DIRECTED_RECV | (v == 0 ? FI_SOURCE : 0);
    if (list) coll__net_fi.freeinfo(list), list = NULL;
    rc = coll__net_fi.getinfo(NET_VERSION, NULL, NULL, 0, hints, &list);
    if (rc == 0 && coll__net_pick(list, a->iface, a->family, NULL) == NULL) rc = -FI_ENODATA;
    if (rc == -FI_ENODATA && v == 0) rc = 0;
    else break;
  }
  if (rc && rc != -ENOMEM) {
    snprintf(err, errlen, "no libfabric provider offers RDM endpoints with tagged messages in order%s%s (%s); "
             "`fi_info -t FI_EP_RDM -c FI_TAGGED` lists what this machine has", a->iface ? " on interface " : "",
             a->iface ? a->iface : "", coll__net_fi.strerror(-rc));
    rc = rc == -FI_ENODATA ? COLL_ENOTSUP : rc;
  }
  struct fi_info *picked = rc == 0 ? coll__net_pick(list, a->iface, a->family, NULL) : NULL;
  if (rc == 0 && (t->info = coll__net_fi.dupinfo(picked)) == NULL) rc = -ENOMEM;
  if (rc == 0 && t->info->domain_attr->cq_data_size < sizeof(uint32_t)) {
    snprintf(err, errlen, "provider %s carries %zu bytes of remote CQ data, fewer than a rank's 4",
             t->info->fabric_attr->prov_name, t->info->domain_attr->cq_data_size);
    rc = COLL_ENOTSUP;
  }
  if (rc == 0) rc = tagged_parts(t, err, errlen);
  if (rc == -ENOMEM) snprintf(err, errlen, "out of memory for a point-to-point endpoint");
  if (list) coll__net_fi.freeinfo(list);
  if (hints) coll__net_fi.freeinfo(hints);
  if (rc) {
    coll__tagged_close(t);
    return rc;
  }
  snprintf(t->line, sizeof t->line, "tagged messages over %s, interface %s", t->info->fabric_attr->prov_name,
           t->info->domain_attr->name);
  *a->t_p = t;
  return 0;
}

int coll__tagged_open(const char *iface, int family, coll__tagged_t **t_p, char *err, size_t errlen) {
  tagged_open_args_t a = {iface, family, t_p, err, errlen};
  return coll__net_keeping_signals(tagged_open, &a);
}

void coll__tagged_close(coll__tagged_t *t) {
  if (t == NULL) return;
  if (t->ep) fi_close(&t->ep->fid);
  if (t->av) fi_close(&t->av->fid);
  if (t->cq) fi_close(&t->cq->fid);
  if (t->domain) fi_close(&t->domain->fid);
  if (t->fabric) fi_close(&t->fabric->fid);
  if (t->info) coll__net_fi.freeinfo(t->info);
  free(t->peers);
  free(t);
}

const char *coll__tagged_describe(const coll__tagged_t *t) { return t->line; }

size_t coll__tagged_card(const coll__tagged_t *t, uint8_t *card) {
  size_t len = COLL_NET_CARD_MAX;
  return fi_getname(&t->ep->fid, card, &len) == 0 ? len : 0;
}

int coll__tagged_add(coll__tagged_t *t, const uint8_t *card, size_t len, char *err, size_t errlen) {
  if (len == 0) {
    snprintf(err, errlen, "a peer's point-to-point card is empty");
    return COLL_EBADARG;
  }
  if (t->npeers == t->cap) {
    int cap = t->cap ? 2 * t->cap : 8;
    fi_addr_t *p = realloc(t->peers, (size_t)cap * sizeof *p);
    if (p == NULL) return -ENOMEM;
    t->peers = p, t->cap = cap;
  }
  int rc = fi_av_insert(t->av, card, 1, &t->peers[t->npeers], 0, NULL);
  if (rc != 1) return coll__net_fail(err, errlen, rc < 0 ? rc : -FI_EINVAL, "fi_av_insert (a peer's address)");
  t->npeers++;
  return 0;
}

/* -EAGAIN for the provider's "try again" (its queues are full), else a sentence. */
static int tagged_posted(ssize_t rc, const char *what, char *err, size_t errlen) {
  if (rc == 0) return 0;
  if (rc == -FI_EAGAIN) return -EAGAIN;
  return coll__net_fail(err, errlen, (int)rc, what);
}

int coll__tagged_send(coll__tagged_t *t, const void *buf, size_t len, int dest, int me, uint64_t tag,
                      coll__tagged_op_t *op, char *err, size_t errlen) {
  op->done = 0;
  uint64_t data = (uint64_t)(uint32_t)me | (t->long_data ? (uint64_t)len << TAGGED_RANK_BITS : 0);
  ssize_t rc = fi_tsenddata(t->ep, buf, len, NULL, data, t->peers[dest], tag, op);
  return tagged_posted(rc, "fi_tsenddata", err, errlen);
}

int coll__tagged_recv(coll__tagged_t *t, void *buf, size_t len, int from, uint64_t want, uint64_t ignore,
                      coll__tagged_op_t *op, char *err, size_t errlen) {
  op->done = 0;
  op->buf = buf, op->len = len, op->from = from, op->want = want, op->ignore = ignore;
  ssize_t rc = fi_trecv(t->ep, buf, len, NULL, from < 0 ? FI_ADDR_UNSPEC : t->peers[from], want, ignore, op);
  return tagged_posted(rc, "fi_trecv", err, errlen);
}

int coll__tagged_cancel(coll__tagged_t *t, coll__tagged_op_t *op) {
  ssize_t rc = fi_cancel(&t->ep->fid, op);
  return rc == 0 ? 0 : rc < 0 ? (int)rc : -EIO;
}

/* A receive that a stranger's message completed: posted again, the drop said once. */
static void tagged_stranger(coll__tagged_t *t, coll__tagged_op_t *op) {
  if (t->dropped++ == 0)
    fprintf(stderr, "hbmcoll: a point-to-point message from no rank of the communicator was dropped (%s)\n", t->line);
  ssize_t rc;
  while ((rc = fi_trecv(t->ep, op->buf, op->len, NULL, op->from < 0 ? FI_ADDR_UNSPEC : t->peers[op->from], op->want,
                        op->ignore, op)) == -FI_EAGAIN) {
    struct fi_cq_tagged_entry e;
    (void)fi_cq_read(t->cq, &e, 0);
  }
  if (rc != 0) { /* not posted again: the receive ends with the provider's failure */
    op->rc = coll__net_broken((int)-rc) ? COLL_EPEERLOST : (int)rc;
    op->done = 1;
  }
}

static int tagged_error(coll__tagged_t *t, char *err, size_t errlen) {
  struct fi_cq_err_entry e = {0};
  ssize_t got = fi_cq_readerr(t->cq, &e, 0);
  if (got != 1) return got == -FI_EAGAIN ? 0 : coll__net_fail(err, errlen, (int)got, "fi_cq_readerr");
  coll__tagged_op_t *op = e.op_context;
  if (op == NULL) return 0;
  /* rxm (1.17) leaves FI_REMOTE_CQ_DATA out of the flags, and len and olen 0, when a receive
   * takes an unexpected message too long for it: the data is there, and says the length */
  uint64_t who = e.data & TAGGED_RANK_MASK;
  if (e.err == FI_ETRUNC && (e.flags & FI_RECV) && who >= (uint64_t)t->npeers) {
    tagged_stranger(t, op);
    return 0;
  }
  op->source = (int)who, op->tag = e.tag;
  op->bytes = t->long_data ? (size_t)(e.data >> TAGGED_RANK_BITS) : op->len + e.olen;
  if (e.err == FI_ETRUNC) op->rc = COLL_EMISMATCH;
  else if (e.err == FI_ECANCELED) op->rc = -ECANCELED;
  else op->rc = coll__net_fail(err, errlen, e.err, e.flags & FI_SEND ? "a point-to-point send" : "a point-to-point receive");
  op->done = 1;
  return 1;
}

int coll__tagged_poll(coll__tagged_t *t, char *err, size_t errlen) {
  struct fi_cq_tagged_entry e[16];
  fi_addr_t src[16];
  int finished = 0;
  for (;;) {
    ssize_t got = t->source ? fi_cq_readfrom(t->cq, e, 16, src) : fi_cq_read(t->cq, e, 16);
    if (got == -FI_EAGAIN) return finished;
    if (got == -FI_EAVAIL) {
      int rc = tagged_error(t, err, errlen);
      if (rc < 0) return rc;
      finished += rc;
      continue;
    }
    if (got < 0) return coll__net_fail(err, errlen, (int)got, "fi_cq_read");
    for (ssize_t k = 0; k < got; k++) {
      coll__tagged_op_t *op = e[k].op_context;
      if (op == NULL) continue;
      if (e[k].flags & FI_RECV) {
        uint64_t who = e[k].data & TAGGED_RANK_MASK;
        int known = (e[k].flags & FI_REMOTE_CQ_DATA) && who < (uint64_t)t->npeers &&
                    (!t->source || src[k] == t->peers[who]);
        if (!known) {
          tagged_stranger(t, op);
          continue;
        }
        op->source = (int)who, op->tag = e[k].tag, op->bytes = e[k].len;
      }
      op->rc = 0;
      op->done = 1;
      finished++;
    }
  }
}

int coll__tagged_idle(coll__tagged_t *t, double *since, double until, double most_s, int watch_fd, unsigned seen) {
  return coll__net_waiter_idle(&t->waiter, since, until, most_s, watch_fd, NULL, 0, &seen);
}

unsigned coll__tagged_stirs(coll__tagged_t *t) { return atomic_load(&t->waiter.stirs); }

void coll__tagged_signal(coll__tagged_t *t) { coll__net_waiter_stir(&t->waiter); }

#else /* built without libfabric's headers */
int coll__tagged_open(const char *iface, int family, coll__tagged_t **t_p, char *err, size_t errlen) {
  (void)iface, (void)family, (void)t_p;
  snprintf(err, errlen, "this build of hbmcoll has no libfabric (built without its headers): no point-to-point "
           "between nodes");
  return COLL_ENOTSUP;
}
void coll__tagged_close(coll__tagged_t *t) { (void)t; }
size_t coll__tagged_card(const coll__tagged_t *t, uint8_t *card) { return (void)t, (void)card, 0; }
int coll__tagged_add(coll__tagged_t *t, const uint8_t *card, size_t len, char *err, size_t errlen) {
  return (void)t, (void)card, (void)len, (void)err, (void)errlen, COLL_ENOTSUP;
}
int coll__tagged_send(coll__tagged_t *t, const void *buf, size_t len, int dest, int me, uint64_t tag,
                      coll__tagged_op_t *op, char *err, size_t errlen) {
  return (void)t, (void)buf, (void)len, (void)dest, (void)me, (void)tag, (void)op, (void)err, (void)errlen,
         COLL_ENOTSUP;
}
int coll__tagged_recv(coll__tagged_t *t, void *buf, size_t len, int from, uint64_t want, uint64_t ignore,
                      coll__tagged_op_t *op, char *err, size_t errlen) {
  return (void)t, (void)buf, (void)len, (void)from, (void)want, (void)ignore, (void)op, (void)err, (void)errlen,
         COLL_ENOTSUP;
}
int coll__tagged_cancel(coll__tagged_t *t, coll__tagged_op_t *op) { return (void)t, (void)op, -ENOSYS; }
int coll__tagged_poll(coll__tagged_t *t, char *err, size_t errlen) { return (void)t, (void)err, (void)errlen, 0; }
int coll__tagged_idle(coll__tagged_t *t, double *since, double until, double most_s, int watch_fd, unsigned seen) {
  return (void)t, (void)since, (void)until, (void)most_s, (void)watch_fd, (void)seen, 1;
}
unsigned coll__tagged_stirs(coll__tagged_t *t) { return (void)t, 0; }
const char *coll__tagged_describe(const coll__tagged_t *t) { return (void)t, "no point-to-point between nodes"; }
void coll__tagged_signal(coll__tagged_t *t) { (void)t; }
#endif /* COLL_NET_OFI */
