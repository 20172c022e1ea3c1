/*
 * net_ofi.h - what the two halves of the bridge over libfabric share (net_ofi_open.c opens and
 * closes the endpoint and meets the peers; net_ofi.c moves notes and bytes): the endpoint's
 * state and libfabric's few symbols, loaded with dlopen. Nothing outside net_ofi*.c includes it.
 */
#ifndef COLL_NET_OFI_H
#define COLL_NET_OFI_H

#include "net.h"
#ifdef COLL_NET_OFI
#include "net_wait.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdint.h>
#include <time.h>

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
  size_t inject;    /* the provider's inject size: writes up to it need no completion */
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

/* libfabric's symbols, once net_ofi_open.c loaded the library (the rest are inline calls). */
typedef struct {
  int tried;
  void *lib;
  int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *,
                 struct fi_info **);
  void (*freeinfo)(struct fi_info *);
  struct fi_info *(*dupinfo)(const struct fi_info *);
  int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
  const char *(*strerror)(int);
} coll__net_fi_t;
extern coll__net_fi_t coll__net_fi;

static inline double coll__net_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A failed libfabric call as a sentence in err; COLL_EPEERLOST where a connection broke (the
 * peer's process, node or link went away), else -errno. */
int coll__net_fail(char *err, size_t errlen, int rc, const char *what);
int coll__net_broken(int e);
/* Load libfabric (once): 0, or COLL_ENOTSUP with a sentence. */
int coll__net_load(char *err, size_t errlen);
/* The entry of list to use: on iface if one is named (libfabric's tcp provider answers with its
 * other interfaces when the name matches none, so the name is checked here), of the job's address
 * family (AF_UNSPEC: IPv4 before IPv6), never a link-local v6 address while another will do (it
 * needs a scope that a card does not carry); NULL if none. *fit_p (if not NULL): how well it fits. */
enum { NET_FIT_NONE, NET_FIT_LINK_LOCAL, NET_FIT_OTHER_FAMILY, NET_FIT_FAMILY };
struct fi_info *coll__net_pick(struct fi_info *list, const char *iface, int family, int *fit_p);
/* open_fn(arg) with the process's signal dispositions kept: libfabric's providers install
 * handlers for SIGINT, SIGTERM, SIGSEGV ... when they load. */
int coll__net_keeping_signals(int (*open_fn)(void *), void *arg);
/* Post `count` receives of no bytes (the notes sent as messages land in them). */
int coll__net_post_receives(coll__net_t *n, int count);

#endif /* COLL_NET_OFI */
#endif /* COLL_NET_OFI_H */
