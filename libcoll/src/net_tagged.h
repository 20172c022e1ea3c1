/*
 * net_tagged.h - tagged messages between the ranks of a communicator that spans nodes (net_tagged.c),
 * for its point-to-point calls (nodes_p2p.c): one libfabric RDM endpoint per rank with FI_TAGGED,
 * whose matching (by source address and 64-bit tag, in the order a sender sent) is MPI's, and whose
 * protocol (eager, then rendezvous for large messages) is the provider's: tcp;ofi_rxm here,
 * verbs;ofi_rxm on InfiniBand and RoCE.
 *
 * Peers are added in rank order, so a peer's number is its rank. Every message carries its sender's
 * rank as remote CQ data; a receive completion whose provider-given source (FI_SOURCE) is not that
 * rank, or no peer at all, is a stranger's: it is dropped and the receive posted again (net.h says
 * why strangers cannot write into the pool; here a tag of 32 random bits stands in front of them).
 */
#ifndef COLL_NET_TAGGED_H
#define COLL_NET_TAGGED_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"

typedef struct coll__tagged coll__tagged_t;

/* One send or receive in flight: the caller's memory, until done. */
typedef struct {
  void *provider[8]; /* the provider's (FI_CONTEXT2): first */
  int done;      /* set by coll__tagged_poll */
  int rc;        /* 0, COLL_EMISMATCH (the message was longer), -ECANCELED, or a failure */
  int source;    /* a receive's sender (its rank) */
  uint64_t tag;  /* a receive's whole tag */
  size_t bytes;  /* a receive's message length (the whole, also when longer than the buffer) */
  /* what a receive was posted with (posted again after a stranger's message) */
  void *buf;
  size_t len;
  int from;      /* -1: any source */
  uint64_t want, ignore;
} coll__tagged_op_t;

/* Open this rank's endpoint on iface (NULL: the provider's first) for the job's address family.
 * 0 and *t_p, or COLL_ENOTSUP / another failure with a sentence in err. */
int coll__tagged_open(const char *iface, int family, coll__tagged_t **t_p, char *err, size_t errlen);
void coll__tagged_close(coll__tagged_t *t); /* NULL is fine; what is in flight is dropped */
/* Its card (at most COLL_NET_CARD_MAX bytes): its address, to send over an authenticated channel. */
size_t coll__tagged_card(const coll__tagged_t *t, uint8_t *card);
/* Add the next peer (rank order, this rank's own card too): 0, or a failure with a sentence. */
int coll__tagged_add(coll__tagged_t *t, const uint8_t *card, size_t len, char *err, size_t errlen);
/* Post a send to rank dest from rank me; 0, -EAGAIN (nothing posted: poll, then try again) or a
 * failure with a sentence. */
int coll__tagged_send(coll__tagged_t *t, const void *buf, size_t len, int dest, int me, uint64_t tag,
                      coll__tagged_op_t *op, char *err, size_t errlen);
/* Post a receive of a message from rank from (-1: any) whose tag equals want in every bit that is
 * not in ignore; 0, -EAGAIN or a failure with a sentence. */
int coll__tagged_recv(coll__tagged_t *t, void *buf, size_t len, int from, uint64_t want, uint64_t ignore,
                      coll__tagged_op_t *op, char *err, size_t errlen);
/* Withdraw a posted receive: 0 (it completes with -ECANCELED at a later poll, unless a message
 * matched it first), or -errno (it cannot be: a send, on this provider). */
int coll__tagged_cancel(coll__tagged_t *t, coll__tagged_op_t *op);
/* Read the completions (and drive the provider's progress): how many ops finished, or a failure
 * of the endpoint with a sentence. */
int coll__tagged_poll(coll__tagged_t *t, char *err, size_t errlen);
/* After an empty poll: spin a little, then block until a completion may be there, watch_fd (>= 0)
 * closes, `until` or most_s passes (net_wait.h). 2 when watch_fd closed, else 0 or 1. seen:
 * coll__tagged_stirs as read before the caller last looked for its completion (a signal since
 * then returns at once). */
int coll__tagged_idle(coll__tagged_t *t, double *since, double until, double most_s, int watch_fd, unsigned seen);
unsigned coll__tagged_stirs(coll__tagged_t *t);
/* Wake the threads blocked in coll__tagged_idle (one thread read completions another waits for). */
void coll__tagged_signal(coll__tagged_t *t);
/* One phrase: the provider and interface. */
const char *coll__tagged_describe(const coll__tagged_t *t);

#endif /* COLL_NET_TAGGED_H */
