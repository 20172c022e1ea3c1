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
 * libfabric is opened with dlopen when the first endpoint is: a job on one node never loads
 * it (nor the verbs and rdmacm libraries it pulls in), and a machine without it gets one
 * sentence at init. Only five of its functions are symbols; the rest are inline calls
 * through the objects' operation tables.
 */
#include "net.h"
#ifdef COLL_NET_OFI
#include "net_wait.h"

#include <dlfcn.h>
#include <errno.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"

#define NET_VERSION FI_VERSION(1, 9)
#define NET_RX_POSTED 64          /* empty receives kept posted (message notes; FI_RX_CQ_DATA) */
#define NET_CARD_MAGIC 0x48424e43u /* "HBNC" */
#define NET_INTERRUPT_S 0.03       /* how often an idle wait asks whether to stop (Ctrl-C) */
#define NET_SETTLING_S 0.001       /* a block while connections may be in setup: poll(2)'s least */

typedef struct {
  uint32_t magic, addrlen;
  uint64_t base, key;
} net_card_head_t;

typedef struct {
  fi_addr_t addr;
  uint64_t base, key;
} net_peer_t;

typedef struct {
  uint32_t note;
  int peer; /* -1: came with a write (the key vouches, the provider does not say who) */
} net_note_t;

struct coll__net {
  struct fi_info *info; /* the one entry chosen (a copy) */
  struct fid_fabric *fabric;
  struct fid_domain *domain;
  struct fid_av *av;
  struct fid_cq *cq;
  struct fid_ep *ep;
  struct fid_mr *mr;
  void *desc;
  uint8_t *pool;
  size_t pool_bytes;
  uint64_t key;
  int virt_addr, rx_cq_data;
  int source; /* FI_SOURCE: a message's completion names its sender */
  int saw;    /* FI_ORDER_SAW: a message sent after a write arrives after its bytes */
  uint64_t dropped; /* notes refused: from no peer of ours, or messages with bytes */
  int mr_local; /* FI_MR_LOCAL: what we write from must be registered (verbs) */
  int own_pool; /* the pool is ours to unmap (not the caller's) */
  int (*interrupt_fn)(void *);
  void *interrupt_arg;
  double next_interrupt_check;
  net_peer_t *peers;
  int npeers, cap;
  uint64_t posted, completed; /* my writes */
  net_note_t *queued;         /* notes that arrived during a flush */
  size_t nqueued, qcap, qhead;
  double timeout_s; /* bounds a write's retries and a flush; 0: none */
  int watch_fd;     /* a connection that closes when a node goes away; -1: none */
  unsigned idle;    /* empty polls since the watch was last looked at */
  int watch_due;    /* a block saw it stir: look at once */
  int settled;      /* a completion came since the last peer was added: its connection is up */
  coll__net_waiter_t waiter; /* how waits block (net_wait.c) */
  char watch_what[64];
  char line[320];
};

static double net_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

static struct {
  int tried;
  void *lib;
  int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                 struct fi_info **);
  void (*freeinfo)(struct fi_info *);
  struct fi_info *(*dupinfo)(const struct fi_info *);
  int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
  const char *(*strerror)(int);
} net_fi;

static int net_load(char *err, size_t errlen) {
  if (!net_fi.tried) {
    net_fi.tried = 1;
    void *lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      *(void **)&net_fi.getinfo = dlsym(lib, "fi_getinfo");
      *(void **)&net_fi.freeinfo = dlsym(lib, "fi_freeinfo");
      *(void **)&net_fi.dupinfo = dlsym(lib, "fi_dupinfo");
      *(void **)&net_fi.fabric = dlsym(lib, "fi_fabric");
      *(void **)&net_fi.strerror = dlsym(lib, "fi_strerror");
      if (net_fi.getinfo && net_fi.freeinfo && net_fi.dupinfo && net_fi.fabric && net_fi.strerror)
        net_fi.lib = lib;
      else
        dlclose(lib);
    }
  }
  if (net_fi.lib) return 0;
  snprintf(err, errlen, "the bridge between nodes needs libfabric, and libfabric.so.1 does not "
           "load here (Debian: apt-get install libfabric1)");
  return COLL_ENOTSUP;
}

/* A broken connection: the peer's process or node went away (or its link), which the caller
 * reports as a lost peer, not as a failed system call. */
static int net_broken(int e) {
  return e == ENOTCONN || e == ECONNRESET || e == EPIPE || e == ECONNABORTED || e == ECONNREFUSED ||
         e == EHOSTUNREACH || e == ENETUNREACH;
}

static int net_fail(char *err, size_t errlen, int rc, const char *what) {
  int e = rc < 0 ? -rc : rc;
  snprintf(err, errlen, "%s: %s", what, net_fi.strerror(e));
  if (net_broken(e)) {
    snprintf(err, errlen, "%s: the connection to another node's rank broke (%s): a node of the job went away",
             what, net_fi.strerror(e));
    return COLL_EPEERLOST;
  }
  return -e;
}

/* The entry to use: on iface if one is named (libfabric's tcp provider answers with its
 * other interfaces when the name matches none, so the name is checked here), IPv4 before
 * IPv6 (link-local v6 addresses need a scope that a card does not carry); NULL if none. */
static int net_on(const struct fi_info *i, const char *iface) {
  return iface == NULL || (i->domain_attr->name && strcmp(i->domain_attr->name, iface) == 0);
}

static struct fi_info *net_pick(struct fi_info *list, const char *iface) {
  for (struct fi_info *i = list; i; i = i->next)
    if (net_on(i, iface) && i->addr_format != FI_SOCKADDR_IN6) return i;
  for (struct fi_info *i = list; i; i = i->next)
    if (net_on(i, iface)) return i;
  return NULL;
}

static int net_post_receives(coll__net_t *n, int count) {
  for (int k = 0; k < count; k++) {
    ssize_t rc;
    while ((rc = fi_recv(n->ep, NULL, 0, NULL, FI_ADDR_UNSPEC, NULL)) == -FI_EAGAIN) {
      struct fi_cq_data_entry e;
      (void)fi_cq_read(n->cq, &e, 0); /* progress only */
    }
    if (rc) return (int)rc;
  }
  return 0;
}

/* A key of key_size bytes (at most 8) from getrandom(2), never 0: 0 or -errno. */
static int net_draw_key(size_t key_size, uint64_t *key_p) {
  uint64_t key = 0;
  while (key == 0) {
    ssize_t got = getrandom(&key, sizeof key, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got != (ssize_t)sizeof key) return got < 0 ? -errno : -EIO;
    if (key_size > 0 && key_size < sizeof key) key &= (UINT64_C(1) << (8 * key_size)) - 1;
  }
  *key_p = key;
  return 0;
}

static int net_open_parts(coll__net_t *n, char *err, size_t errlen) {
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_DATA, .wait_obj = COLL_NET_WAIT_OBJ};
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE};
  int rc;
  if ((rc = net_fi.fabric(n->info->fabric_attr, &n->fabric, NULL)) != 0)
    return net_fail(err, errlen, rc, "fi_fabric");
  if ((rc = fi_domain(n->fabric, n->info, &n->domain, NULL)) != 0)
    return net_fail(err, errlen, rc, "fi_domain");
  if ((rc = fi_cq_open(n->domain, &cq_attr, &n->cq, NULL)) != 0) { /* no wait object: the waits yield */
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(n->domain, &cq_attr, &n->cq, NULL)) != 0) return net_fail(err, errlen, rc, "fi_cq_open");
  }
  coll__net_waiter_open(&n->waiter, n->fabric, n->cq, cq_attr.wait_obj);
  if ((rc = fi_av_open(n->domain, &av_attr, &n->av, NULL)) != 0)
    return net_fail(err, errlen, rc, "fi_av_open");
  if ((rc = fi_endpoint(n->domain, n->info, &n->ep, NULL)) != 0)
    return net_fail(err, errlen, rc, "fi_endpoint");
  if ((rc = fi_ep_bind(n->ep, &n->av->fid, 0)) != 0 ||
      (rc = fi_ep_bind(n->ep, &n->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
    return net_fail(err, errlen, rc, "fi_ep_bind");
  if ((rc = fi_enable(n->ep)) != 0) return net_fail(err, errlen, rc, "fi_enable");
  uint64_t mr_mode = (uint64_t)n->info->domain_attr->mr_mode;
  uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, key = 0;
  if (!(mr_mode & FI_MR_PROV_KEY) && (rc = net_draw_key(n->info->domain_attr->mr_key_size, &key)) != 0) {
    snprintf(err, errlen, "could not draw the pool's key (getrandom): %s", strerror(-rc));
    return rc;
  }
  if ((rc = fi_mr_reg(n->domain, n->pool, n->pool_bytes, access, 0, key, 0, &n->mr, NULL)) != 0)
    return net_fail(err, errlen, rc, "fi_mr_reg (the pool)");
  if (mr_mode & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(n->mr, &n->ep->fid, 0)) != 0 || (rc = fi_mr_enable(n->mr)) != 0)
      return net_fail(err, errlen, rc, "fi_mr_bind (the pool)");
  }
  n->key = fi_mr_key(n->mr);
  n->desc = fi_mr_desc(n->mr);
  n->virt_addr = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  n->mr_local = (mr_mode & FI_MR_LOCAL) != 0;
  n->rx_cq_data = (n->info->mode & FI_RX_CQ_DATA) != 0;
  n->source = (n->info->caps & FI_SOURCE) != 0;
  n->saw = (n->info->tx_attr->msg_order & n->info->rx_attr->msg_order & FI_ORDER_SAW) != 0;
  /* posted always: message notes need them, and a message that finds none waits in the
   * provider's unexpected queue for ever (a stranger's would pile up there) */
  if ((rc = net_post_receives(n, NET_RX_POSTED)) != 0) return net_fail(err, errlen, rc, "fi_recv");
  return 0;
}

/* libfabric's providers install handlers for SIGINT, SIGTERM, SIGSEGV ... when they load (the
 * shm provider, to unlink its regions, then exits): the process's own (Python's, which turns
 * Ctrl-C into KeyboardInterrupt) would be gone. Opening keeps the dispositions it found. */
static const int net_kept_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE};
#define NET_KEPT (sizeof net_kept_signals / sizeof net_kept_signals[0])

static int net_open(const char *iface, void *pool, size_t pool_bytes, coll__net_t **net_p, char *err,
                    size_t errlen);

int coll__net_open(const char *iface, size_t pool_bytes, coll__net_t **net_p, char *err,
                   size_t errlen) {
  return coll__net_open_on(iface, NULL, pool_bytes, net_p, err, errlen);
}

int coll__net_open_on(const char *iface, void *pool, size_t pool_bytes, coll__net_t **net_p, char *err,
                      size_t errlen) {
  if (pool && pool_bytes < 65536) return COLL_EBADARG;
  struct sigaction kept[NET_KEPT];
  for (size_t i = 0; i < NET_KEPT; i++) sigaction(net_kept_signals[i], NULL, &kept[i]);
  int rc = net_open(iface, pool, pool_bytes, net_p, err, errlen);
  for (size_t i = 0; i < NET_KEPT; i++) sigaction(net_kept_signals[i], &kept[i], NULL);
  return rc;
}

static int net_open(const char *iface, void *pool, size_t pool_bytes, coll__net_t **net_p, char *err,
                    size_t errlen) {
  int rc = net_load(err, errlen);
  if (rc) return rc;
  struct fi_info *hints = net_fi.dupinfo(NULL), *list = NULL;
  coll__net_t *n = calloc(1, sizeof *n);
  rc = hints && n ? 0 : -ENOMEM;
  if (n) n->watch_fd = -1;
  if (rc == 0) {
    hints->ep_attr->type = FI_EP_RDM;
    hints->mode = FI_RX_CQ_DATA;
    hints->domain_attr->mr_mode =
        FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    if (iface && (hints->domain_attr->name = strdup(iface)) == NULL) rc = -ENOMEM;
  }
  /* sources where the provider has them (tcp;ofi_rxm, shm, verbs;ofi_rxm), else none. Not
   * FI_ORDER_SAW: rxm says it has it unasked, and asked, shm gives up virtual addresses */
  for (int v = 0; rc == 0 && v < 2; v++) {
    hints->caps = FI_MSG | FI_RMA | (v == 0 ? FI_SOURCE : 0);
    if (list) net_fi.freeinfo(list), list = NULL;
    rc = net_fi.getinfo(NET_VERSION, NULL, NULL, 0, hints, &list);
    if (rc == 0 && net_pick(list, iface) == NULL) rc = -FI_ENODATA;
    if (rc == -FI_ENODATA && v == 0) rc = 0;
    else break;
  }
  if (rc && rc != -ENOMEM) {
    const char *prov = getenv("FI_PROVIDER");
    snprintf(err, errlen, "no libfabric provider offers RDM endpoints with RMA%s%s%s%s (%s); "
             "`fi_info -t FI_EP_RDM -c FI_RMA` lists what this machine has",
             prov ? " for FI_PROVIDER=" : "", prov ? prov : "", iface ? " on interface " : "",
             iface ? iface : "", net_fi.strerror(-rc));
    rc = rc == -FI_ENODATA ? COLL_ENOTSUP : rc;
  }
  if (rc == 0) {
    n->info = net_fi.dupinfo(net_pick(list, iface));
    n->own_pool = pool == NULL;
    n->pool_bytes = pool ? pool_bytes : (pool_bytes + 4095) & ~(size_t)4095;
    n->pool = pool ? pool : mmap(NULL, n->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (n->info == NULL || n->pool == MAP_FAILED) {
      n->pool = NULL;
      rc = -ENOMEM;
      snprintf(err, errlen, "out of memory for the network pool of %zu bytes", n->pool_bytes);
    } else if (n->info->domain_attr->cq_data_size < sizeof(uint32_t)) {
      rc = COLL_ENOTSUP;
      snprintf(err, errlen, "provider %s carries %zu bytes of remote CQ data, fewer than a note's 4",
               n->info->fabric_attr->prov_name, n->info->domain_attr->cq_data_size);
    } else {
      rc = net_open_parts(n, err, errlen);
    }
  }
  if (list) net_fi.freeinfo(list);
  if (hints) net_fi.freeinfo(hints);
  if (rc) {
    coll__net_close(n);
    return rc;
  }
  snprintf(n->line, sizeof n->line, "provider %s, fabric %s, interface %s, %s", n->info->fabric_attr->prov_name,
           n->info->fabric_attr->name, n->info->domain_attr->name, n->waiter.how);
  *net_p = n;
  return 0;
}

void coll__net_close(coll__net_t *n) {
  if (n == NULL) return;
  if (n->ep) fi_close(&n->ep->fid);
  if (n->mr) fi_close(&n->mr->fid);
  if (n->av) fi_close(&n->av->fid);
  if (n->cq) fi_close(&n->cq->fid);
  if (n->domain) fi_close(&n->domain->fid);
  if (n->fabric) fi_close(&n->fabric->fid);
  if (n->info) net_fi.freeinfo(n->info);
  if (n->pool && n->own_pool) munmap(n->pool, n->pool_bytes);
  free(n->peers);
  free(n->queued);
  free(n);
}

const char *coll__net_describe(const coll__net_t *n) { return n->line; }
uint8_t *coll__net_pool(coll__net_t *n) { return n->pool; }
size_t coll__net_pool_bytes(const coll__net_t *n) { return n->pool_bytes; }

size_t coll__net_card(const coll__net_t *n, uint8_t *card) {
  net_card_head_t h = {NET_CARD_MAGIC, 0, n->virt_addr ? (uint64_t)(uintptr_t)n->pool : 0, n->key};
  size_t len = COLL_NET_CARD_MAX - sizeof h;
  if (fi_getname(&n->ep->fid, card + sizeof h, &len) != 0) len = 0;
  h.addrlen = (uint32_t)len;
  memcpy(card, &h, sizeof h);
  return sizeof h + len;
}

int coll__net_add_peer(coll__net_t *n, const uint8_t *card, size_t len, int *peer_p, char *err,
                       size_t errlen) {
  net_card_head_t h;
  if (len < sizeof h) return COLL_EBADARG;
  memcpy(&h, card, sizeof h);
  if (h.magic != NET_CARD_MAGIC || h.addrlen == 0 || sizeof h + h.addrlen > len) {
    snprintf(err, errlen, "a peer's network card is malformed");
    return COLL_EBADARG;
  }
  if (n->npeers == n->cap) {
    int cap = n->cap ? 2 * n->cap : 8;
    net_peer_t *p = realloc(n->peers, (size_t)cap * sizeof *p);
    if (p == NULL) return -ENOMEM;
    n->peers = p, n->cap = cap;
  }
  net_peer_t *p = &n->peers[n->npeers];
  int rc = fi_av_insert(n->av, card + sizeof h, 1, &p->addr, 0, NULL);
  if (rc != 1) return net_fail(err, errlen, rc < 0 ? rc : -FI_EINVAL, "fi_av_insert (a peer's address)");
  p->base = h.base, p->key = h.key;
  *peer_p = n->npeers++;
  n->settled = 0;
  return 0;
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
      int rc = net_post_receives(n, 1);
      if (rc) return net_fail(err, errlen, rc, "fi_recv");
      net_drop(n, "that carried bytes (a message from outside the job)");
      return 0;
    }
    if (net_broken(ee.err)) return net_fail(err, errlen, ee.err, "a network transfer");
    snprintf(err, errlen, "a network transfer failed: %s (%s)", net_fi.strerror(ee.err),
             fi_cq_strerror(n->cq, ee.prov_errno, ee.err_data, NULL, 0));
    return ee.err ? -ee.err : -EIO;
  }
  if (got < 0) return net_fail(err, errlen, (int)got, "fi_cq_read");
  n->settled = 1;
  int message = (e.flags & FI_RECV) && !(e.flags & FI_REMOTE_WRITE);
  if (message || (n->rx_cq_data && (e.flags & FI_REMOTE_CQ_DATA))) { /* it took one of our receives */
    int rc = net_post_receives(n, 1);
    if (rc) return net_fail(err, errlen, rc, "fi_recv");
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
  if (until > 0 && (slept || (spins & 1023) == 0) && net_now() > until) {
    snprintf(err, errlen, "%s in %.0f s", late, n->timeout_s);
    return -ETIMEDOUT;
  }
  return 0;
}

/* Post one write from src (desc: its registration, NULL where the provider needs none); the
 * note with it, or (sourced) as a message of no bytes behind it, which names me to the peer. */
static int net_post(coll__net_t *n, int peer, const void *src, void *desc, size_t to, size_t len,
                    uint32_t note, int sourced, uint64_t *sent_p, char *err, size_t errlen) {
  const net_peer_t *p = &n->peers[peer];
  double until = n->timeout_s ? net_now() + n->timeout_s : 0, since = 0;
  for (unsigned spins = 1;; spins++) {
    ssize_t rc = sourced ? fi_write(n->ep, src, len, desc, p->addr, p->base + to, p->key, sent_p)
                         : fi_writedata(n->ep, src, len, desc, note, p->addr, p->base + to, p->key, sent_p);
    if (rc == 0) break;
    if (rc != -FI_EAGAIN) return net_fail(err, errlen, (int)rc, sourced ? "fi_write" : "fi_writedata");
    /* the provider wants progress (rxm connects on demand); it retries a peer that went away
     * for ever, hence the watch and the limit */
    int r = net_step(n, until, spins, &since, "a write to another node's rank found no way through", err, errlen);
    if (r) return r;
  }
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
    if (rc != -FI_EAGAIN) return net_fail(err, errlen, (int)rc, "fi_injectdata (a note)");
    int r = net_step(n, until, spins, &since, "a note to another node's rank found no way through", err, errlen);
    if (r) return r;
  }
}

int coll__net_write(coll__net_t *n, int peer, size_t from, size_t to, size_t len, uint32_t note,
                    uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || from + len > n->pool_bytes || len > n->pool_bytes)
    return COLL_EBADARG;
  return net_post(n, peer, n->pool + from, n->desc, to, len, note, 0, sent_p, err, errlen);
}

int coll__net_write_sourced(coll__net_t *n, int peer, size_t from, size_t to, size_t len, uint32_t note,
                            uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || from + len > n->pool_bytes || len > n->pool_bytes)
    return COLL_EBADARG;
  return net_post(n, peer, n->pool + from, n->desc, to, len, note, 1, sent_p, err, errlen);
}

uint64_t coll__net_dropped(const coll__net_t *n) { return n->dropped; }

int coll__net_any_source(const coll__net_t *n) { return !n->mr_local; }

void coll__net_set_interrupt(coll__net_t *n, int (*fn)(void *), void *arg) {
  n->interrupt_fn = fn, n->interrupt_arg = arg;
}

int coll__net_interrupted(coll__net_t *n) {
  if (n->interrupt_fn == NULL) return 0;
  double now = net_now();
  if (now < n->next_interrupt_check) return 0;
  n->next_interrupt_check = now + NET_INTERRUPT_S;
  return n->interrupt_fn(n->interrupt_arg) != 0;
}

int coll__net_write_from(coll__net_t *n, int peer, const void *src, size_t len, size_t to, uint32_t note,
                         uint64_t *sent_p, char *err, size_t errlen) {
  if (peer < 0 || peer >= n->npeers || n->mr_local || len > n->pool_bytes) return COLL_EBADARG;
  return net_post(n, peer, src, NULL, to, len, note, 0, sent_p, err, errlen);
}

int coll__net_flush(coll__net_t *n, char *err, size_t errlen) {
  double until = n->timeout_s ? net_now() + n->timeout_s : 0, since = 0;
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
  int rc = coll__net_waiter_idle(&n->waiter, since, until, most, n->watch_fd, extra, nextra);
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
