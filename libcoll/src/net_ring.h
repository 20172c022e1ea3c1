/*
 * net_ring.h - collectives between nodes over the bridge (net.h): the members of a ring,
 * one endpoint per node slice, each writing only into its right neighbour's pool.
 *
 * Every transfer is one chunk written into one of the right neighbour's two receive slots
 * with a note saying which transfer it is; the neighbour answers with a credit note once it
 * has consumed the slot, and a slot is written again only after its credit came back. So
 * two transfers are in flight per link, and nothing but the bridge's notes synchronises the
 * members. The transfers are numbered on from one collective to the next. Small allgathers (every
 * call's meeting across nodes) take the eager path instead: no slots, no credits (see there).
 */
#ifndef COLL_NET_RING_H
#define COLL_NET_RING_H

#include <stddef.h>

#include "coll.h"
#include "net.h"

typedef struct coll__net_ring coll__net_ring_t;

/* A ring of n members (n >= 1) in which this endpoint is member `me`; left and right are
 * the net peers (coll__net_add_peer) of members me-1 and me+1 (unused when n == 1). The
 * ring uses the endpoint's whole pool: an 8th for the small allgather, 4 KiB for credits, the
 * rest in 4 chunks. Returns 0 and
 * *ring_p, COLL_EBADARG (a pool under 64 KiB, me out of range) or -ENOMEM. */
int coll__net_ring_make(coll__net_t *net, int n, int me, int left, int right,
                        coll__net_ring_t **ring_p);
void coll__net_ring_free(coll__net_ring_t *ring); /* NULL is fine */
int coll__net_ring_members(const coll__net_ring_t *ring); /* n */
/* The bytes of one receive slot: a step's chunk (a transfer never carries more). */
size_t coll__net_ring_slot_bytes(const coll__net_ring_t *ring);

/* In place, on every member at once: buf[0..count) becomes op over the members' buffers
 * (reduce-scatter then allgather around the ring, so each element is reduced by one member
 * and every member gets the same bits; with 2 members and up to one slot, an exchange: each
 * sends the other its whole message and folds in member order, one step instead of two; the
 * same bits where both run the same code in the default floating-point mode, float16 and
 * bfloat16 excepted, which keep the ring). op: SUM, PROD, MIN, MAX (AVG is the caller's sum
 * and division). timeout_s > 0 bounds each wait for a neighbour. Returns 0, COLL_EBADARG,
 * -ETIMEDOUT, or the bridge's failure; err says which neighbour and what happened. */
int coll__net_ring_allreduce(coll__net_ring_t *ring, coll_dtype_t dtype, coll_op_t op, void *buf,
                             size_t count, double timeout_s, char *err, size_t errlen);

/* In place, on every member at once: buf[0..count) is cut in n segments (the first count % n
 * one element longer), and member m's segment m becomes op over the members' (the first half
 * of an allreduce: every other segment is left partly reduced). Returns as
 * coll__net_ring_allreduce. */
int coll__net_ring_reduce_scatter(coll__net_ring_t *ring, coll_dtype_t dtype, coll_op_t op, void *buf,
                                  size_t count, double timeout_s, char *err, size_t errlen);

/* On every member at once: member root's buf[0..bytes) into every other member's buf, passed along
 * the ring chunk by chunk (a chain: each link carries the bytes once). Returns as
 * coll__net_ring_allreduce. */
int coll__net_ring_bcast(coll__net_ring_t *ring, int root, void *buf, size_t bytes, double timeout_s, char *err,
                         size_t errlen);

/* Member `member`'s net peer, for the allgather of small blocks in ceil(log2 n) steps (which
 * writes to members other than the neighbours); COLL_EBADARG if member is out of range. */
int coll__net_ring_reach(coll__net_ring_t *ring, int member, int peer);

/* On every member at once, with the same j and bytes: my src[0..bytes) goes to member me + j,
 * and member me - j's lands in my dst (src and dst apart), in chunks with the ring's credits.
 * Members other than the neighbours must have been reached (coll__net_ring_reach): else
 * COLL_EBADARG. The pairwise step of an alltoall (j = 1 .. n-1). Returns as
 * coll__net_ring_allreduce. */
int coll__net_ring_shift(coll__net_ring_t *ring, int j, const void *src, void *dst, size_t bytes, double timeout_s,
                         char *err, size_t errlen);

/* In place, on every member at once: buf holds n blocks of `block` bytes, member m's own in
 * block m; afterwards every member has all n. Where every member was reached and a block is at
 * most coll__net_ring_eager_block, by the eager path: ceil(log2 n) steps (Bruck's dissemination),
 * each one transfer each way with no credit (2 members: one in all); else around the ring.
 * Returns as coll__net_ring_allreduce. */
int coll__net_ring_allgather(coll__net_ring_t *ring, void *buf, size_t block, double timeout_s, char *err,
                             size_t errlen);
/* The same where only each block's first `used` bytes matter (used <= block), and of my own
 * block only the first `own` (own <= used; each member may pass its own): the eager path moves
 * and copies no more (the rest of the blocks are left as anything), so a step of a few dozen
 * bytes goes as one injected transfer. */
/* The largest block the eager path takes: the n blocks fill half of an 8th of the pool (with 2
 * members and 4 MiB, 128 KiB). */
size_t coll__net_ring_eager_block(const coll__net_ring_t *ring);
int coll__net_ring_allgather_used(coll__net_ring_t *ring, void *buf, size_t block, size_t used, size_t own,
                                  double timeout_s, char *err, size_t errlen);

/* Collective, the ring's last call: once it returns no member writes into my pool any more and my
 * writes completed, so the endpoint may close under nobody (a member that closed while a neighbour
 * still had a credit to post would leave that write retrying for ever). Every member must have been
 * reached (coll__net_ring_reach), else COLL_EBADARG. Returns as coll__net_ring_allreduce. */
int coll__net_ring_goodbye(coll__net_ring_t *ring, double timeout_s, char *err, size_t errlen);

#endif /* COLL_NET_RING_H */
