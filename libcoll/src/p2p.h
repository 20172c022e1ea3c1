/*
 * p2p.h - point-to-point between the ranks of one node: what p2p_channel.c (the shared
 * channels), p2p_match.c (matching and progress) and p2p.c (the calls, waiting, requests)
 * share. The essay on the design is at the top of p2p_channel.c.
 */
#ifndef COLL_P2P_H
#define COLL_P2P_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coll_internal.h"

#define COLL_P2P_CELL 4096u     /* one cell: header + payload */
#define COLL_P2P_CELL_HEAD 64u  /* so COLL_P2P_EAGER_MAX = 4096 - 64 (coll.h) */
#define COLL_P2P_RDV 64u        /* rendezvous in flight per ordered pair */
#define COLL_P2P_CHAN_HEAD 1024u /* head, tail and rendezvous words before the cells */
_Static_assert(COLL_P2P_EAGER_MAX == COLL_P2P_CELL - COLL_P2P_CELL_HEAD, "coll.h's eager limit");

/* In the segment. */
enum { P2P_EAGER = 1, P2P_RTS, P2P_LONG, P2P_CHUNK };
typedef struct {
  int32_t kind;   /* P2P_* */
  int32_t tag;
  uint64_t bytes; /* the whole message */
  uint64_t len;   /* payload in this cell */
  uint64_t addr;  /* P2P_RTS: the message's address in the sender's process */
  uint64_t rdv;   /* P2P_RTS: its rendezvous number on this channel (from 1) */
} coll__p2p_cell_t;
_Static_assert(sizeof(coll__p2p_cell_t) <= COLL_P2P_CELL_HEAD, "cell header");

typedef struct {
  _Alignas(COLL_LINE) _Atomic uint64_t head; /* cells the sender published (only grows) */
  _Alignas(COLL_LINE) _Atomic uint64_t tail; /* cells the receiver is done with (only grows) */
  /* rendezvous n lives in rdv[n % COLL_P2P_RDV] as (n << 2) | state */
  _Alignas(COLL_LINE) _Atomic uint64_t rdv[COLL_P2P_RDV];
  /* a large rendezvous the receiver copies with the sender's help (p2p_copy.c) */
  _Alignas(COLL_LINE) _Atomic uint64_t co_claim; /* (rendezvous number << 24) | chunks claimed */
  _Atomic uint64_t co_done;                      /* chunks copied */
  uint64_t co_dst, co_len;                       /* the receiver's buffer, bytes to copy */
  _Atomic int32_t co_err;                        /* a helper's copy failed: the receiver redoes it */
} coll__p2p_chan_t;
_Static_assert(sizeof(coll__p2p_chan_t) <= COLL_P2P_CHAN_HEAD, "channel head");
enum { RDV_POSTED = 0, RDV_PULLING = 1, RDV_DONE = 2, RDV_REVOKED = 3 };

typedef struct {
  _Alignas(COLL_LINE) _Atomic uint32_t bell; /* futex word: bumped when a sleeper must look */
  _Atomic uint32_t sleepers;                 /* this rank's threads asleep on it */
  _Atomic uint32_t help; /* futex word of this rank's helper thread (p2p_helper.c): bumped by a
                          * peer that has waited long for this rank, and to stop the helper */
} coll__p2p_bell_t;

/* In this process. */
typedef struct coll__p2p_op coll__p2p_op_t;
enum { OP_QUEUED = 1, OP_PULL_WAIT, OP_POSTED, OP_TAKING, OP_DONE };
struct coll__p2p_op {
  int send;        /* 1 send, 0 receive */
  int peer, tag;   /* a receive's may be COLL_ANY_* */
  uint8_t *buf;
  size_t bytes;
  size_t off;      /* pieces pushed (send) so far */
  uint64_t rdv;    /* a send by rendezvous: its number */
  int stage;       /* OP_*: where it is */
  int result;
  int request;     /* owned by a coll_req_t (else on a blocking call's stack) */
  int freed;       /* the request was freed: free the op when it finishes */
  coll_status_t status;
  coll__p2p_t *p;
  coll__p2p_op_t *prev, *next; /* in the list its stage says */
  coll__p2p_op_t *lprev, *lnext; /* every request not yet finished (p->live) */
};

/* A message no receive was posted for yet. */
typedef struct coll__p2p_msg coll__p2p_msg_t;
struct coll__p2p_msg {
  int source, tag, kind; /* kind: P2P_EAGER (data holds it), P2P_RTS (in the sender still,
                          * unless data: then pulled), P2P_LONG (pieces still coming into data) */
  size_t bytes, got;
  uint64_t addr, rdv;
  uint8_t *data;
  coll__p2p_msg_t *prev, *next;
};

typedef struct {
  coll__p2p_op_t *head, *tail;
} coll__p2p_list_t;

/* A long message coming in pieces from one source: into a receive, an unexpected message, or
 * nowhere (its receive was withdrawn). */
typedef struct {
  int active;
  coll__p2p_op_t *op;
  coll__p2p_msg_t *msg;
  size_t got, bytes;
  int tag;
} coll__p2p_cur_t;

struct coll__p2p {
  pthread_mutex_t lock;
  pthread_cond_t idle; /* inside fell to 0 */
  int refs;            /* the communicator, and each request not yet freed */
  int inside;          /* threads between p2p_enter and p2p_leave */
  coll_comm_t *c;      /* NULL once the communicator is freed */
  int rank, size;
  size_t cells;
  uint64_t stride;
  uint8_t *chans;            /* channel (s, d) at chans + (s * size + d) * stride */
  coll__p2p_bell_t *bells;
  uint64_t *sent, *tail_seen, *rdv_next; /* per destination */
  uint64_t *taken;                       /* per source */
  coll__p2p_list_t *outq;                /* per destination: sends not wholly in the channel */
  coll__p2p_list_t pulls;                /* sends waiting for the receiver to pull */
  coll__p2p_list_t posted;               /* receives, in the order they were posted */
  coll__p2p_msg_t *unx_head, *unx_tail;  /* unexpected messages, in arrival order */
  coll__p2p_cur_t *cur;                  /* per source */
  coll__p2p_op_t *live;                  /* unfinished requests */
  double loaded_until;                   /* a wait was preempted: sleep early until then */
  pthread_t helper;                      /* p2p_helper.c */
  int helper_on, helper_stop;
};

/* p2p_channel.c */
static inline coll__p2p_chan_t *coll__p2p_chan(coll__p2p_t *p, int s, int d) {
  return (coll__p2p_chan_t *)(p->chans + ((uint64_t)s * (uint64_t)p->size + (uint64_t)d) * p->stride);
}
static inline coll__p2p_cell_t *coll__p2p_cell(coll__p2p_t *p, coll__p2p_chan_t *ch, uint64_t n) {
  return (coll__p2p_cell_t *)((uint8_t *)ch + COLL_P2P_CHAN_HEAD + (n % p->cells) * COLL_P2P_CELL);
}
static inline uint8_t *coll__p2p_payload(coll__p2p_cell_t *cell) { return (uint8_t *)cell + COLL_P2P_CELL_HEAD; }
/* Wake `rank` if it sleeps on its doorbell (after what it waits for is published). */
void coll__p2p_ring(coll__p2p_t *p, int rank);
/* Move this rank's sends to `dest` into the channel as far as free cells allow. */
void coll__p2p_push(coll__p2p_t *p, int dest);
/* 1 when cells of the channel to dest are free (re-reading its tail when needed). */
int coll__p2p_room(coll__p2p_t *p, int dest);
/* Whether rank `peer` pulls large messages itself (CMA works for it). */
int coll__p2p_pulls(coll__p2p_t *p, int peer);
/* Copy n bytes of the message at `addr` in `source`'s process into dst: 0 or a failure. */
int coll__p2p_pull(coll__p2p_t *p, int source, void *dst, uint64_t addr, size_t n);

/* p2p_helper.c */
/* Start this rank's helper thread (the lock held): 0 or -errno. */
int coll__p2p_helper_start(coll__p2p_t *p);
/* Stop and join it (the lock not held). */
void coll__p2p_helper_stop(coll__p2p_t *p);
/* A waiter that has waited long for `rank` asks that rank's helper to move its operations
 * along (and to take unexpected messages aside, so their senders may go on). */
void coll__p2p_ask(coll__p2p_t *p, int rank);

/* p2p_copy.c */
/* The receiver: rendezvous n of `source` (at addr there) into dst, len bytes; a large one in
 * chunks the sender, if it is waiting, helps copy. 0 or a failure (the communicator's). */
int coll__p2p_copy_in(coll__p2p_t *p, int source, uint64_t n, void *dst, uint64_t addr, size_t len);
/* The sender: copy chunks of op's rendezvous its receiver is copying now, if any. */
void coll__p2p_copy_help(coll__p2p_t *p, coll__p2p_op_t *op);

/* p2p_match.c */
/* One step for every channel and pending operation; `deep` (a waiter that has waited long
 * enough, or a helper a peer asked) also pulls unexpected large messages, so their senders
 * are free to go on. */
void coll__p2p_progress(coll__p2p_t *p, int deep);
/* 1 when an operation of this rank needs this rank to act: a send not wholly in its channel,
 * a receive posted, or a long message coming in pieces. */
int coll__p2p_pending(const coll__p2p_t *p);
/* A new receive: takes an unexpected message if one matches, else joins `posted`. */
void coll__p2p_post_recv(coll__p2p_t *p, coll__p2p_op_t *op);
/* Take `op` out of whatever it is in, if it can be: 1 withdrawn, 0 it is too far along (a send
 * half way through the channel: the caller fails the communicator; a send being pulled: the
 * caller waits for it). */
int coll__p2p_withdraw(coll__p2p_t *p, coll__p2p_op_t *op);
void coll__p2p_finish(coll__p2p_t *p, coll__p2p_op_t *op, int result);
void coll__p2p_list_push(coll__p2p_list_t *l, coll__p2p_op_t *op);
void coll__p2p_list_remove(coll__p2p_list_t *l, coll__p2p_op_t *op);

#endif /* COLL_P2P_H */
