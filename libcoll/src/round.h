/*
 * round.h - the round layer: the steps every algorithm is written in.
 *
 * A collective is a run of numbered rounds, the same numbers on every rank. In a round a
 * rank stages data in its slot and publishes (its arrival), waits for the peers it needs,
 * consumes what they published, and says it has finished reading (done). This layer owns
 * the round numbers, which of a rank's two slots a round uses and when the slot may be
 * refilled, and the descriptors ranks compare before any data moves; it reaches the other
 * ranks only through the transport table (transport.h). Algorithms (algo_*.c) call these
 * functions and nothing of the communicator's insides.
 *
 * Every function returning int gives 0 or the communicator's failure code, the same on
 * every rank (COLL_EMISMATCH, COLL_EPEERLOST, -ETIMEDOUT, ...).
 */
#ifndef COLL_ROUND_H
#define COLL_ROUND_H

#include "coll_internal.h"
#include "tree.h"

/* ---- a collective's rounds ---- */
/* Start a collective: my descriptor says what I call (algo: the path I chose, 0 none;
 * send_off/recv_off: where peers find my buffers in the shared segment, 0: they do not).
 * Returns t0, its first round. */
uint64_t coll__round_begin(coll_comm_t *c, const coll_args_t *a, int algo, uint64_t send_off,
                           uint64_t recv_off);
/* My descriptor's offsets are addresses in my process (single copy, cma.c). */
void coll__round_single_copy(coll_comm_t *c);
/* The collective's last round; the next collective starts after it. */
static inline void coll__round_end(coll_comm_t *c, uint64_t last) { c->round = last; }
/* The round the next collective (or the one being set up) starts at. */
static inline uint64_t coll__round_next(const coll_comm_t *c) { return c->round + 1; }
/* The collective ends at round `last` and hands over to another algorithm that begins its
 * own rounds (a descriptor of one call, not two, in error messages). */
void coll__round_handover(coll_comm_t *c, uint64_t last);

/* The collective I am in returns before its peers compared my descriptor with theirs (a
 * bcast's root, a small gather's sender: they stage what the others need and go, as MPI's
 * eager sends do). My next call, or coll_comm_settle, compares them first (coll__settle):
 * a disagreement reaches me there. Safe because no rank writes its descriptor for seq s+2
 * before every peer arrived at s+1, where each has compared what it left unchecked of s. */
static inline void coll__round_unchecked(coll_comm_t *c, uint64_t t0) {
  c->unchecked_seq = c->seq;
  c->unchecked_round = t0;
}
/* Compare every peer's descriptor of my unchecked call with mine (waiting for them to reach
 * it): 0, or COLL_EMISMATCH naming both calls (or a wait's failure). */
int coll__settle(coll_comm_t *c);

/* ---- descriptors ---- */
/* Wait for peer's arrival at t0 and compare its descriptor with mine (COLL_EMISMATCH,
 * naming both calls, on any difference). */
int coll__meet(coll_comm_t *c, int peer, uint64_t t0);
int coll__meet_all(coll_comm_t *c, uint64_t t0);
/* Compare a peer's descriptor (it has arrived at the first round already). */
int coll__validate(coll_comm_t *c, int peer);
static inline const coll__desc_t *coll__peer_desc(coll_comm_t *c, int peer) {
  return c->tp->desc(c, peer, c->seq);
}

/* ---- staging and signals ---- */
int coll__wait_all(coll_comm_t *c, uint64_t t);
int coll__wait_all_finished(coll_comm_t *c, uint64_t t);
/* Until my children in the tree rooted at `root` said done for round t. */
int coll__wait_children_finished(coll_comm_t *c, int root, uint64_t t);
/* My slot for data published at round t, once its readers finished with what it held. A
 * giver whose call is unchecked compares first when they are reading that call (a multi-chunk
 * bcast's root refilling chunk 0's slot): two ranks that each think they give would
 * otherwise wait for each other. */
static inline int coll__stage(coll_comm_t *c, uint64_t t, uint8_t **slot_p) {
  int parity = (int)(t & 1), reader = c->slot_reader[parity], rc;
  uint64_t need = c->slot_last_read[parity];
  if (c->unchecked_seq && need >= c->unchecked_round && (rc = coll__settle(c)) != 0) return rc;
  rc = reader >= 0    ? c->tp->wait_done(c, reader, need)
       : reader == -1 ? coll__wait_all_finished(c, need)
                      : coll__wait_children_finished(c, -2 - reader, need);
  if (rc) return rc;
  *slot_p = c->tp->slot(c, c->rank, parity);
  return 0;
}
/* Publish my arrival at round t; what I staged for t is read by `reader` (-1: every rank;
 * coll__tree_readers(root): my children in that tree) until round `until`, when they say done. */
static inline void coll__publish_staged(coll_comm_t *c, uint64_t t, int reader, uint64_t until) {
  c->tp->publish_arrive(c, t);
  c->slot_last_read[t & 1] = until;
  c->slot_reader[t & 1] = reader;
}
static inline int coll__tree_readers(int root) { return -2 - root; }
/* coll__stage, a copy of len bytes from src, coll__publish_staged(c, t, reader, t). */
int coll__post(coll_comm_t *c, uint64_t t, const void *src, size_t len, int reader);
/* Up to this many bytes, a rank's part of a one-round collective rides in its descriptor:
 * its readers take it from the line they compared, one cache line fewer to cross. */
#define COLL_INLINE_MAX 8
_Static_assert(COLL_INLINE_MAX <= sizeof(((coll__desc_t *)0)->payload), "the payload holds it");
static inline int coll__inline(size_t nbytes) { return nbytes > 0 && nbytes <= COLL_INLINE_MAX; }
/* coll__post of len <= COLL_INLINE_MAX bytes into my descriptor of this call instead of my
 * slot (after coll__round_begin). The same wait first, for the slot's bookkeeping (its last
 * readers' done is not lost); the descriptor itself may be rewritten two calls on because
 * every peer arrived at the call between (coll__execute settles an unchecked one first). */
int coll__post_inline(coll_comm_t *c, uint64_t t, const void *src, size_t len, int reader);
/* What `peer` posted inline in this call. */
static inline const uint8_t *coll__peer_inline(coll_comm_t *c, int peer) {
  return coll__peer_desc(c, peer)->payload;
}
/* my arrival at t, no data of mine; done reading what was published at t */
static inline void coll__publish(coll_comm_t *c, uint64_t t) { c->tp->publish_arrive(c, t); }
static inline void coll__finish(coll_comm_t *c, uint64_t t) { c->tp->publish_done(c, t); }
static inline int coll__wait(coll_comm_t *c, int peer, uint64_t t) { return c->tp->wait_arrive(c, peer, t); }
static inline int coll__wait_finished(coll_comm_t *c, int peer, uint64_t t) {
  return c->tp->wait_done(c, peer, t);
}
/* What `peer` staged for round t. */
static inline const uint8_t *coll__peer_slot(coll_comm_t *c, int peer, uint64_t t) {
  return c->tp->slot(c, peer, (int)(t & 1));
}

/* ---- on the tree (tree.h): a rank meets only its parent and children ---- */
/* Compare the descriptors of my parent and children with mine at t0 (each publishes t0 first
 * thing). Whatever each rank called, some rank on a tree edge between two different calls
 * finds the difference before it signals up the tree, so none completes. */
int coll__tree_meet(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t0);
/* Until every child of mine arrived at round t. */
int coll__wait_children(coll_comm_t *c, const coll__tree_view_t *v, uint64_t t);

/* A collective made of K all-to-all rounds (K >= 1, so it always meets): round k stages
 * my slot with fill(ctx, k, slot), publishes, then takes what every peer staged: one peer
 * at a time from my right (take(ctx, k, peer, slot); at the first round each is compared
 * with me first), or with take_each 0 all at once after all arrived (take(ctx, k, -1,
 * NULL)); then says done. */
typedef void (*coll__fill_fn)(void *ctx, uint64_t k, uint8_t *slot);
typedef void (*coll__take_fn)(void *ctx, uint64_t k, int peer, const uint8_t *slot);
int coll__exchange(coll_comm_t *c, const coll_args_t *a, uint64_t K, coll__fill_fn fill,
                   coll__take_fn take, int take_each, void *ctx);
/* Stage piece [off, off+len) of each of P blocks of nbytes from src side by side, piece
 * bytes apart, into slot; block `skip` (-1: none) is left out. */
void coll__stage_pieces(uint8_t *slot, const uint8_t *src, size_t nbytes, size_t piece,
                        size_t off, size_t len, int P, int skip);

/* ---- what algorithms may know of the segment ---- */
static inline size_t coll__slot_bytes(const coll_comm_t *c) { return c->hdr->slot_bytes; }
/* From this many bytes, results are written with streaming stores (the same on every rank). */
static inline size_t coll__stream_min(const coll_comm_t *c) { return c->hdr->stream_min; }
/* From this many bytes, an allreduce of arena buffers pushes (algo_allreduce.c; likewise). */
static inline size_t coll__push_min(const coll_comm_t *c) { return c->hdr->push_min; }
/* From this many bytes, a push writes with streaming stores (likewise). */
static inline size_t coll__push_stream_min(const coll_comm_t *c) { return c->hdr->push_stream_min; }
/* Up to this many bytes a message is small (HBMCOLL_SMALL_MAX). */
static inline size_t coll__small_max(const coll_comm_t *c) { return c->hdr->small_max; }
/* The algorithm forced for a kind (HBMCOLL_ALGO, coll_set_algorithm), 0: automatic. */
static inline int coll__forced_algo(const coll_comm_t *c, coll_kind_t kind) { return c->params.algo[kind]; }
/* Single copy between private buffers works here and pays from this many bytes (cma.c). */
static inline int coll__single_copy_from(const coll_comm_t *c, coll_kind_t kind, size_t nbytes) {
  return c->cma && (c->hdr->cma_kinds >> kind & 1) && nbytes >= c->hdr->cma_min;
}
/* 1 when every rank has a CPU of its own (rank 0's view at creation, the same on all). */
static inline int coll__roomy(const coll_comm_t *c) { return c->hdr->roomy != 0; }
/* The small collectives' tree (tree.h), NULL when there is none. */
static inline const coll__tree_t *coll__tree(const coll_comm_t *c) { return c->tree; }
/* The address of a segment offset a peer published. */
static inline uint8_t *coll__shared(coll_comm_t *c, uint64_t off) { return c->base + off; }
/* Single copy with a peer's process: read (write 0) or write n bytes at its address remote. */
static inline int coll__peer_copy(coll_comm_t *c, int peer, void *local, uint64_t remote, size_t n,
                                  int write) {
  return c->tp->copy_peer(c, peer, local, remote, n, write);
}

static inline size_t coll__min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t coll__div_up(size_t a, size_t b) { return (a + b - 1) / b; }

#endif /* COLL_ROUND_H */
