/*
 * net_ring_int.h - what the ring (net_ring.c: slots, credits, the ring's algorithms) and its eager
 * path for small allgathers (net_eager.c: no slots, no credits) share: the ring's state, the
 * notes' bits, and the one wait both use. Nothing else includes it.
 */
#ifndef COLL_NET_RING_INT_H
#define COLL_NET_RING_INT_H

#include <stdint.h>

#include "net_ring.h"

#define RING_CREDIT 0x80000000u /* a note's top bit: credit (from the right), else data */
#define RING_HOP 0x40000000u    /* the next bit: a step of the small allgather (ring_hops) */
#define RING_NUM 0x3fffffffu    /* the rest: the transfer's or step's number */
#define RING_BYE (RING_CREDIT | RING_HOP | RING_NUM) /* a goodbye (coll__net_ring_goodbye): a "ready"
                                                        * of the one number no shift starts at */
#define RING_SEEN 8             /* notes kept by number, per kind */
#define HOP_SEEN 32             /* steps kept by number: 4 allgathers of up to 8 steps */
#define RING_SCRATCH 4096       /* the pool's tail: where credits land */

struct coll__net_ring {
  coll__net_t *net;
  int n, me, left, right;
  size_t chunk;       /* bytes per slot */
  uint32_t next;      /* the next transfer's number */
  /* the last notes of each kind by number, UINT32_MAX where none came (numbers are < 2^31) */
  uint32_t data_seen[RING_SEEN], credit_seen[RING_SEEN];
  uint64_t staged[2], sent[2]; /* writes from each send slot: posted, completed */
  int direct;         /* chunks written straight from the caller's buffer, not staged */
  int *reach;         /* net peer of each member (-1: none yet), for the small allgather */
  uint32_t hops;      /* small allgathers so far */
  uint32_t hop_seen[HOP_SEEN];
  uint64_t hop_staged[2], hop_sent[2]; /* writes (not injects) from each small allgather area */
  uint32_t ready_seen[RING_SEEN]; /* "ready from transfer t on", from a new right neighbour */
  int cur_left, cur_right;  /* the neighbours of the last run (a shift has others) */
  uint32_t fresh;           /* the first transfer since they changed: no credit before it */
  size_t hop_area;    /* the pool's bytes before the scratch: the small allgather's two areas */
  int byes;           /* goodbyes from the other members */
};

/* What a wait is for: the left neighbour's data t, the right neighbour's credit t, the completion
 * of my write from send slot t % 2, a small allgather's step t, a new right neighbour's "ready
 * from t on", the completion of my writes from small allgather area t % 2, every other member's
 * goodbye. */
enum { RING_DATA, RING_CREDIT_OF, RING_SENT, RING_HOP_OF, RING_READY_OF, RING_HOP_SENT, RING_BYES };

/* Until `what` for number t: every note that arrives meanwhile is kept by number (net_ring.c). */
int coll__net_ring_wait(coll__net_ring_t *r, int what, uint32_t t, double timeout_s, char *err, size_t errlen);

/* The eager small allgather (net_eager.c), for coll__net_ring_allgather_used where it applies. */
int coll__net_eager_allgather(coll__net_ring_t *r, uint8_t *buf, size_t block, size_t used, size_t own,
                              double timeout_s, char *err, size_t errlen);

/* Where small allgather `call`'s area starts in the pool: the two alternate. */
static inline size_t coll__net_hop_off(const coll__net_ring_t *r, uint32_t call) {
  return 4 * r->chunk + (call & 1) * (r->hop_area / 2);
}

#endif /* COLL_NET_RING_INT_H */
