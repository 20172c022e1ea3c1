/*
 * net_ofi_open.c - opening the bridge's endpoint over libfabric (net.h, net_ofi.h): the provider
 * chosen from what fi_getinfo returns, the pool registered under a key drawn at random, the
 * receives posted, and the peers added from their cards. net_ofi.c says what the providers
 * differ in; the data path is there.
 *
 * libfabric is opened with dlopen when the first endpoint is: a job on one node never loads
 * it (nor the verbs and rdmacm libraries it pulls in), and a machine without it gets one
 * sentence at init. Only five of its functions are symbols; the rest are inline calls
 * through the objects' operation tables.
 */
#include "net_ofi.h"
#ifdef COLL_NET_OFI

#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "coll.h"

coll__net_fi_t coll__net_fi;

int coll__net_load(char *err, size_t errlen) {
  if (!coll__net_fi.tried) {
    coll__net_fi.tried = 1;
    void *lib = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib) {
      *(void **)&coll__net_fi.getinfo = dlsym(lib, "fi_getinfo");
      *(void **)&coll__net_fi.freeinfo = dlsym(lib, "fi_freeinfo");
      *(void **)&coll__net_fi.dupinfo = dlsym(lib, "fi_dupinfo");
      *(void **)&coll__net_fi.fabric = dlsym(lib, "fi_fabric");
      *(void **)&coll__net_fi.strerror = dlsym(lib, "fi_strerror");
      if (coll__net_fi.getinfo && coll__net_fi.freeinfo && coll__net_fi.dupinfo && coll__net_fi.fabric && coll__net_fi.strerror)
        coll__net_fi.lib = lib;
      else
        dlclose(lib);
    }
  }
  if (coll__net_fi.lib) return 0;
  snprintf(err, errlen, "the bridge between nodes needs libfabric, and libfabric.so.1 does not "
           "load here (Debian: apt-get install libfabric1)");
  return COLL_ENOTSUP;
}

/* A broken connection: the peer's process or node went away (or its link), which the caller
 * reports as a lost peer, not as a failed system call. */
int coll__net_broken(int e) {
  return e == ENOTCONN || e == ECONNRESET || e == EPIPE || e == ECONNABORTED || e == ECONNREFUSED ||
         e == EHOSTUNREACH || e == ENETUNREACH;
}

int coll__net_fail(char *err, size_t errlen, int rc, const char *what) {
  int e = rc < 0 ? -rc : rc;
  snprintf(err, errlen, "%s: %s", what, coll__net_fi.strerror(e));
  if (coll__net_broken(e)) {
    snprintf(err, errlen, "%s: the connection to another node's rank broke (%s): a node of the job went away",
             what, coll__net_fi.strerror(e));
    return COLL_EPEERLOST;
  }
  return -e;
}

/* coll__net_pick (net_ofi.h says what it picks) */
static int net_on(const struct fi_info *i, const char *iface) {
  return iface == NULL || (i->domain_attr->name && strcmp(i->domain_attr->name, iface) == 0);
}

static int net_fit(const struct fi_info *i, const char *iface, int family) {
  if (!net_on(i, iface)) return NET_FIT_NONE;
  if (i->addr_format == FI_SOCKADDR_IN6) {
    const struct sockaddr_in6 *a = i->src_addr;
    if (a && i->src_addrlen >= sizeof *a && IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) return NET_FIT_LINK_LOCAL;
    return family == AF_INET6 ? NET_FIT_FAMILY : NET_FIT_OTHER_FAMILY;
  }
  if (i->addr_format == FI_SOCKADDR_IN) return family == AF_INET6 ? NET_FIT_OTHER_FAMILY : NET_FIT_FAMILY;
  return NET_FIT_FAMILY; /* no IP address (shm's names): any family */
}

struct fi_info *coll__net_pick(struct fi_info *list, const char *iface, int family, int *fit_p) {
  struct fi_info *best = NULL;
  int fit = NET_FIT_NONE;
  for (struct fi_info *i = list; i; i = i->next) {
    int f = net_fit(i, iface, family);
    if (f > fit) best = i, fit = f;
  }
  if (fit_p) *fit_p = fit;
  return best;
}

int coll__net_post_receives(coll__net_t *n, int count) {
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
  if ((rc = coll__net_fi.fabric(n->info->fabric_attr, &n->fabric, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_fabric");
  if ((rc = fi_domain(n->fabric, n->info, &n->domain, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_domain");
  if ((rc = fi_cq_open(n->domain, &cq_attr, &n->cq, NULL)) != 0) { /* no wait object: the waits yield */
    cq_attr.wait_obj = FI_WAIT_NONE;
    if ((rc = fi_cq_open(n->domain, &cq_attr, &n->cq, NULL)) != 0) return coll__net_fail(err, errlen, rc, "fi_cq_open");
  }
  coll__net_waiter_open(&n->waiter, n->fabric, n->cq, cq_attr.wait_obj);
  if ((rc = fi_av_open(n->domain, &av_attr, &n->av, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_av_open");
  if ((rc = fi_endpoint(n->domain, n->info, &n->ep, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_endpoint");
  if ((rc = fi_ep_bind(n->ep, &n->av->fid, 0)) != 0 ||
      (rc = fi_ep_bind(n->ep, &n->cq->fid, FI_TRANSMIT | FI_RECV)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_ep_bind");
  if ((rc = fi_enable(n->ep)) != 0) return coll__net_fail(err, errlen, rc, "fi_enable");
  uint64_t mr_mode = (uint64_t)n->info->domain_attr->mr_mode;
  uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE, key = 0;
  if (!(mr_mode & FI_MR_PROV_KEY) && (rc = net_draw_key(n->info->domain_attr->mr_key_size, &key)) != 0) {
    snprintf(err, errlen, "could not draw the pool's key (getrandom): %s", strerror(-rc));
    return rc;
  }
  if ((rc = fi_mr_reg(n->domain, n->pool, n->pool_bytes, access, 0, key, 0, &n->mr, NULL)) != 0)
    return coll__net_fail(err, errlen, rc, "fi_mr_reg (the pool)");
  if (mr_mode & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(n->mr, &n->ep->fid, 0)) != 0 || (rc = fi_mr_enable(n->mr)) != 0)
      return coll__net_fail(err, errlen, rc, "fi_mr_bind (the pool)");
  }
  n->key = fi_mr_key(n->mr);
  n->desc = fi_mr_desc(n->mr);
  n->virt_addr = (mr_mode & FI_MR_VIRT_ADDR) != 0;
  n->mr_local = (mr_mode & FI_MR_LOCAL) != 0;
  n->rx_cq_data = (n->info->mode & FI_RX_CQ_DATA) != 0;
  n->source = (n->info->caps & FI_SOURCE) != 0;
  n->inject = n->info->tx_attr->inject_size;
  n->saw = (n->info->tx_attr->msg_order & n->info->rx_attr->msg_order & FI_ORDER_SAW) != 0;
  /* posted always: message notes need them, and a message that finds none waits in the
   * provider's unexpected queue for ever (a stranger's would pile up there) */
  if ((rc = coll__net_post_receives(n, NET_RX_POSTED)) != 0) return coll__net_fail(err, errlen, rc, "fi_recv");
  return 0;
}

/* libfabric's providers install handlers for SIGINT, SIGTERM, SIGSEGV ... when they load (the
 * shm provider, to unlink its regions, then exits): the process's own (Python's, which turns
 * Ctrl-C into KeyboardInterrupt) would be gone. Opening keeps the dispositions it found. */
static const int net_kept_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE};
#define NET_KEPT (sizeof net_kept_signals / sizeof net_kept_signals[0])

static int net_open(const char *iface, int family, void *pool, size_t pool_bytes, coll__net_t **net_p,
                    char *err, size_t errlen);

int coll__net_open(const char *iface, size_t pool_bytes, coll__net_t **net_p, char *err,
                   size_t errlen) {
  return coll__net_open_on(iface, AF_UNSPEC, NULL, pool_bytes, net_p, err, errlen);
}

int coll__net_keeping_signals(int (*open_fn)(void *), void *arg) {
  struct sigaction kept[NET_KEPT];
  for (size_t i = 0; i < NET_KEPT; i++) sigaction(net_kept_signals[i], NULL, &kept[i]);
  int rc = open_fn(arg);
  for (size_t i = 0; i < NET_KEPT; i++) sigaction(net_kept_signals[i], &kept[i], NULL);
  return rc;
}

typedef struct {
  const char *iface;
  int family;
  void *pool;
  size_t pool_bytes;
  coll__net_t **net_p;
  char *err;
  size_t errlen;
} net_open_args_t;

static int net_open_kept(void *arg) {
  net_open_args_t *a = arg;
  return net_open(a->iface, a->family, a->pool, a->pool_bytes, a->net_p, a->err, a->errlen);
}

int coll__net_open_on(const char *iface, int family, void *pool, size_t pool_bytes, coll__net_t **net_p,
                      char *err, size_t errlen) {
  if (pool && pool_bytes < 65536) return COLL_EBADARG;
  net_open_args_t a = {iface, family, pool, pool_bytes, net_p, err, errlen};
  return coll__net_keeping_signals(net_open_kept, &a);
}

static int net_open(const char *iface, int family, void *pool, size_t pool_bytes, coll__net_t **net_p,
                    char *err, size_t errlen) {
  int rc = coll__net_load(err, errlen);
  if (rc) return rc;
  struct fi_info *hints = coll__net_fi.dupinfo(NULL), *list = NULL;
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
    if (list) coll__net_fi.freeinfo(list), list = NULL;
    rc = coll__net_fi.getinfo(NET_VERSION, NULL, NULL, 0, hints, &list);
    if (rc == 0 && coll__net_pick(list, iface, family, NULL) == NULL) rc = -FI_ENODATA;
    if (rc == -FI_ENODATA && v == 0) rc = 0;
    else break;
  }
  if (rc && rc != -ENOMEM) {
    const char *prov = getenv("FI_PROVIDER");
    snprintf(err, errlen, "no libfabric provider offers RDM endpoints with RMA%s%s%s%s (%s); "
             "`fi_info -t FI_EP_RDM -c FI_RMA` lists what this machine has",
             prov ? " for FI_PROVIDER=" : "", prov ? prov : "", iface ? " on interface " : "",
             iface ? iface : "", coll__net_fi.strerror(-rc));
    rc = rc == -FI_ENODATA ? COLL_ENOTSUP : rc;
  }
  int fit = NET_FIT_NONE;
  struct fi_info *picked = rc == 0 ? coll__net_pick(list, iface, family, &fit) : NULL;
  if (rc == 0 && family == AF_INET6 && fit < NET_FIT_FAMILY) {
    snprintf(err, errlen, "the job's addresses are IPv6, and no libfabric provider%s%s offers RDM endpoints "
             "with RMA over IPv6%s%s (only over IPv4 or a link-local address); use an IPv4 master address, "
             "or an interface (HBMCOLL_IFACE) with a global or ULA IPv6 address",
             getenv("FI_PROVIDER") ? " of FI_PROVIDER=" : "", getenv("FI_PROVIDER") ? getenv("FI_PROVIDER") : "",
             iface ? " on interface " : "", iface ? iface : "");
    rc = COLL_ENOTSUP;
  }
  if (rc == 0) {
    n->info = coll__net_fi.dupinfo(picked);
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
  if (list) coll__net_fi.freeinfo(list);
  if (hints) coll__net_fi.freeinfo(hints);
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
  if (n->info) coll__net_fi.freeinfo(n->info);
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
  if (rc != 1) return coll__net_fail(err, errlen, rc < 0 ? rc : -FI_EINVAL, "fi_av_insert (a peer's address)");
  p->base = h.base, p->key = h.key;
  *peer_p = n->npeers++;
  n->settled = 0;
  return 0;
}

#endif /* COLL_NET_OFI */
