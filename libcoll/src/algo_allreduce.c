/*
 * algo_allreduce.c - allreduce, and reduce to a root (same data movement, only
 * the root keeps the result).
 *
 * "flat" (small and medium messages; default up to HBMCOLL_SMALL_MAX): each
 * round every rank copies the next slot-sized chunk of its input into its
 * staging slot and publishes; then every rank that wants the result reduces
 * all P slots in one P-way pass (ranks in order, so all get bitwise the same
 * answer) straight into its output. One synchronisation per chunk; P-fold
 * redundant reads, which is cheap while P x chunk stays in cache.
 *
 * "rsag" (large): pipelined reduce-scatter + allgather. Each chunk is cut into
 * P slices (64-byte aligned where possible); rank r reduces slice r of the
 * chunk from all P slots in one pass (its own input straight from its send
 * buffer: a rank never stages its own slice) and writes the result into that
 * slice of its slot (only r writes there), then, one round later, every rank copies
 * all P result slices of that chunk into its output while the next chunk is
 * being reduced. Staging chunks stay in cache, so memory sees about one read
 * of the input and one write of the output per rank: the 2PN bound.
 *
 * Single copy: a rank whose buffers live in the shared arena (hbmcoll.empty)
 * skips staging; peers read its input, and in rsag find its result slice in
 * its output, directly. Its descriptor says so (send_off/recv_off), so ranks
 * may mix. Such a rank returns only when all peers finished reading its
 * buffers. In flat, an input is read in place only if it does not overlap
 * the output (peers would otherwise read what the owner is overwriting);
 * rsag is safe in place because slice owners only ever write their own slice.
 *
 * Push: when every rank's input and output are in the arena and the message
 * is at least HBMCOLL_PUSH_MIN (default 0: whenever rsag would run), rank r
 * reduces slice r of the whole message, block by block into an L1 scratch,
 * and writes each block into every rank's output: one read of each input and
 * one write of each output, no second copy; from HBMCOLL_PUSH_STREAM_MIN with
 * streaming stores (no read for ownership). Slice r is rank r's to claim
 * first, but any rank that has written its own claims slices nobody has
 * claimed yet: a rank that arrived and then lost its core to another task
 * (core_share.c) holds up nobody, and finds its output written when it runs.
 * Such a peer may not yet have compared my descriptor, so my call after next,
 * which writes to that descriptor's place, first waits for it (collective.c).
 * With 2 ranks the first round's descriptors already show every buffer in the
 * arena, and the push starts there. The tune measures both thresholds. From
 * HBMCOLL_STREAM_MIN rsag's copy-out, and flat's reduce, write an output apart
 * from its input with streaming stores (each rank for itself). Below it, with data that may still be cached, ordinary stores and
 * rsag's reads from a peer's cache are faster; and in place they always are:
 * staging the input has just brought the output's lines into the cache.
 *
 * Two ranks, private buffers: flat at every size. With P = 2 it
 * moves the same bytes as rsag (each rank writes N for its peer and reads the
 * N its peer wrote) in half the dependent cross-core steps per chunk. But
 * rsag reads and writes arena buffers in place (hbmcoll.empty, also in
 * place), and whether a peer's buffers are in the arena shows only in its
 * descriptor. So flat's first round doubles as the choice: each rank
 * publishes where its buffers are (recv_off: both in the arena, where rsag
 * is zero copy) and stages its first chunk as flat would; when no rank has
 * both in the arena, flat goes on with no extra round (a separate round
 * would cost a sixth of a 64 KiB call); otherwise every rank sees
 * it in the same descriptors and all go to rsag from the next round (the
 * staged chunk is dropped; a rank whose own buffers decide it stages
 * nothing).
 *
 * Empty messages still take one round, so disagreements are always caught.
 */
#include <string.h>

#include "algorithms.h"
#include "round.h"

/* AR_FLAT_FIRST: flat whose first round may hand over to rsag (top); its own id, so that a rank
 * forced to plain flat and one choosing never pair up (their descriptors then disagree). */
enum { AR_FLAT = 1, AR_RSAG = 2, AR_FLAT_FIRST = 3 };

static int ar_rsag(coll_comm_t *c, const coll_args_t *a);
static int ar_push(coll_comm_t *c, const coll_args_t *a, uint64_t t0);

static size_t ar_slice(int q, int P, size_t n) {
  if (q >= P) return n;
  return (n * (size_t)q / (size_t)P) & ~(size_t)15;
}

static int ar_overlap(const void *a, const void *b, size_t n) {
  const uint8_t *x = a, *y = b;
  return x < y + n && y < x + n;
}

enum { AR_BLOCK = 4096 }; /* bytes of scratch: stays in L1 between reduce and copies */

/* Write my output with streaming stores? From HBMCOLL_STREAM_MIN, unless it is my input too. */
static int ar_stream_out(coll_comm_t *c, const coll_args_t *a, size_t nbytes) {
  int want = a->kind == COLL_ALLREDUCE || c->rank == a->root;
  return want && nbytes >= coll__stream_min(c) && !ar_overlap(a->send, a->recv, nbytes);
}

/* Reduce n elements of the P inputs block by block into an L1 scratch, and copy each block
 * into every one of the nout outputs, in their order (streaming stores if stream: the caller
 * fences). Flat's streamed reduce (one output) and push (every rank's) are this. */
static void ar_reduce_blocks(coll_comm_t *c, const coll_args_t *a, const void *const *in, int P,
                             uint8_t *const *out, int nout, size_t n, int stream) {
  size_t es = coll_dtype_size(a->dtype), BE = AR_BLOCK / es;
  _Alignas(64) uint8_t scratch[AR_BLOCK];
  const void *blk[P];
  for (size_t i = 0; i < n; i += BE) {
    size_t m = coll__min(BE, n - i);
    for (int q = 0; q < P; q++) blk[q] = (const uint8_t *)in[q] + i * es;
    coll_reduce_local(a->dtype, a->op, scratch, blk, (size_t)P, m, (size_t)P);
    for (int k = 0; k < nout; k++) coll__copy(c, out[k] + i * es, scratch, m * es, stream);
  }
}

/* The first round of a 2-rank allreduce in flat said some rank has both buffers in the arena
 * (recv_off, published only then): rsag, which then reads and writes them in place. */
static int ar_any_arena(coll_comm_t *c) {
  for (int q = 0; q < c->size; q++)
    if (coll__peer_desc(c, q)->recv_off) return 1;
  return 0;
}

static int ar_all_in_arena(coll_comm_t *c) {
  for (int q = 0; q < c->size; q++)
    if (!coll__peer_desc(c, q)->send_off || !coll__peer_desc(c, q)->recv_off) return 0;
  return 1;
}

/* spec: allreduce with 2 ranks in auto mode; the first round may hand over to rsag (top). */
static int ar_flat(coll_comm_t *c, const coll_args_t *a, int spec) {
  size_t es = coll_dtype_size(a->dtype), nbytes = a->count * es;
  size_t CE = coll__slot_bytes(c) / es;
  uint64_t K = a->count ? coll__div_up(a->count, CE) : 1;
  int me = c->rank, P = c->size, rc;
  int all = a->kind == COLL_ALLREDUCE, want = all || me == a->root;
  int reader = all ? -1 : a->root;
  const uint8_t *send = a->send;
  uint8_t *recv = a->recv;
  uint64_t zoff = coll__arena_offset(c, send, nbytes);
  /* rsag is zero copy only for a rank with both buffers in the arena (in place counts); an
   * arena input alone flat reads in place too, and an arena output alone gains nothing */
  uint64_t roff = spec && zoff ? coll__arena_offset(c, recv, nbytes) : 0;
  int to_rsag = roff != 0; /* so will every rank be rsag */
  int stream = ar_stream_out(c, a, nbytes);
  /* in place, peers would read what I overwrite; a rank handing over reads nothing here */
  if (zoff && want && !to_rsag && ar_overlap(send, recv, nbytes)) zoff = 0;
  /* a small reduce's non-root stages even an arena input: then it can give and go (below) */
  if (zoff && !want && nbytes <= coll__small_max(c)) zoff = 0;
  const void *in[P];

  /* a reduce's non-root with a staged input only gives: it returns once its input is staged
   * and compares at its next call (round.h), or before it waits on the root's progress
   * (coll__stage) */
  int gives = !want && !zoff;
  int inl = coll__inline(nbytes) && K == 1; /* a staged input rides in its rank's descriptor */
  uint64_t t0 = coll__round_begin(c, a, spec ? AR_FLAT_FIRST : AR_FLAT, zoff, roff);
  if (gives) coll__round_unchecked(c, t0);
  for (uint64_t k = 0; k < K; k++) {
    uint64_t t = t0 + k;
    size_t off = k * CE, n = a->count ? coll__min(CE, a->count - off) : 0;
    if (!zoff && !to_rsag) { /* to_rsag: k = 0 is the last round */
      rc = inl ? coll__post_inline(c, t, send, nbytes, reader)
               : coll__post(c, t, send + off * es, n * es, reader);
      if (rc) return rc;
    } else {
      coll__publish(c, t);
    }
    if (!want) { /* compare with the root at t0: it may not think it is the root */
      if (k == 0 && !gives && (rc = coll__meet(c, a->root, t0)) != 0) return rc;
      continue;
    }
    rc = k == 0 ? coll__meet_all(c, t0) : coll__wait_all(c, t);
    if (rc) return rc;
    if (k == 0 && spec && nbytes >= coll__push_min(c) && ar_all_in_arena(c)) { /* no second round */
      c->algorithm = "push";
      return ar_push(c, a, t0);
    }
    if (k == 0 && spec && ar_any_arena(c)) { /* all see the same descriptors */
      coll__round_handover(c, t0);
      c->algorithm = "rsag";
      return ar_rsag(c, a);
    }
    int any_zc = 0;
    for (int q = 0; q < P; q++) {
      uint64_t qoff = coll__peer_desc(c, q)->send_off;
      in[q] = qoff  ? coll__shared(c, qoff) + off * es
              : inl ? coll__peer_inline(c, q)
                    : coll__peer_slot(c, q, t);
      any_zc |= qoff != 0;
    }
    /* my own part from my input, not from the slot my peers are reading (no line shared
     * with their reads); send and recv are the same or apart (aliasing.c) */
    if (!zoff) in[me] = send + off * es;
    uint8_t *out = recv + off * es;
    if (n && stream) ar_reduce_blocks(c, a, in, P, &out, 1, n, 1);
    else if (n) coll_reduce_local(a->dtype, a->op, out, in, (size_t)P, n, (size_t)P);
    /* In allreduce my next arrival says "done" for me (every rank waits for
     * every arrival); an explicit `done` is for the root's readers in reduce
     * and for ranks whose arena input I read (they wait for it). Skipping it
     * spares the peers one more transfer of the line they poll. */
    if (!all || any_zc) coll__finish(c, t);
  }
  uint64_t last = t0 + K - 1;
  coll__round_end(c, last);
  if (stream) coll__stream_fence();
  if (gives) return 0;
  if (!want) { /* learn the root's verdict; it may still read my arena input */
    if ((rc = coll__wait_finished(c, a->root, last)) != 0) return rc;
    return coll__validate(c, a->root);
  }
  /* peers read my arena input only in allreduce; in reduce only the root reads
   * (itself), and the others publish no `done` for it: waiting would block the
   * root until they start their next collective on this communicator */
  return zoff && all ? coll__wait_all_finished(c, last) : 0;
}

/* Reduce rank s's slice of the whole message and write it into every output. */
static void ar_push_slice(coll_comm_t *c, const coll_args_t *a, int s, int stream) {
  size_t es = coll_dtype_size(a->dtype);
  int P = c->size;
  size_t lo = ar_slice(s, P, a->count), hi = ar_slice(s + 1, P, a->count);
  const void *in[P];
  uint8_t *out[P];
  for (int k = 0; k < P; k++) { /* slice s's owner's output first, then the next ranks': not all
                                 * into rank 0 at once */
    int q = (s + k) % P;
    in[k] = coll__shared(c, coll__peer_desc(c, k)->send_off) + lo * es;
    out[k] = coll__shared(c, coll__peer_desc(c, q)->recv_off) + lo * es;
  }
  ar_reduce_blocks(c, a, in, P, out, P, hi - lo, stream);
  if (stream) coll__stream_fence(); /* the streamed results before the flag that says so */
}

/* Every rank's slice is reduced by the first rank to claim it: each claims its own, then any
 * slice still unclaimed once its own is written, so a rank whose core went to another task (it
 * arrived first and gave the core away, core_share.c) costs the others no wait for its turn on
 * the CPU. A rank returns once every slice is written: then nobody reads its input either. */
static int ar_push(coll_comm_t *c, const coll_args_t *a, uint64_t t0) {
  int me = c->rank, P = c->size;
  int stream = a->count * coll_dtype_size(a->dtype) >= coll__push_stream_min(c);
  int claims = P <= 1 << COLL_SLICE_RANK_BITS ? P : 1; /* the claim word names the claimant */
  for (int k = 0; k < claims; k++) {
    int s = (me + k) % P;
    if (!coll__claim_slice(c, s, t0)) continue;
    ar_push_slice(c, a, s, stream);
    coll__publish_slice(c, s, t0);
  }
  coll__finish(c, t0);
  coll__round_end(c, t0);
  for (int k = 1; k <= P; k++) {
    int rc = coll__wait_slice(c, (me + k) % P, t0);
    if (rc) return rc;
  }
  for (int q = 0; q < P; q++) /* a peer that has not yet compared my descriptor with its own */
    if (q != me && atomic_load_explicit(&c->ctl[q].done, memory_order_acquire) < t0) {
      c->push_open_seq = c->seq;
      c->push_open_round = t0;
      break;
    }
  return 0;
}

static int ar_rsag(coll_comm_t *c, const coll_args_t *a) {
  size_t es = coll_dtype_size(a->dtype), nbytes = a->count * es;
  size_t CE = coll__slot_bytes(c) / es;
  uint64_t K = coll__div_up(a->count, CE);
  int me = c->rank, P = c->size, rc;
  int all = a->kind == COLL_ALLREDUCE, want = all || me == a->root;
  const uint8_t *send = a->send;
  uint8_t *recv = a->recv;
  uint64_t soff = 0, roff = 0;
  if (all) {
    soff = coll__arena_offset(c, send, nbytes);
    roff = coll__arena_offset(c, recv, nbytes);
    if (!soff || !roff) soff = roff = 0; /* send == recv or apart (aliasing.c) */
  }
  int zc = soff != 0;
  int stream = ar_stream_out(c, a, nbytes); /* the copy-out writes my output once */
  const void *in[P];

  uint64_t t0 = coll__round_begin(c, a, AR_RSAG, soff, roff);
  for (uint64_t k = 0; k <= K; k++) {
    uint64_t t = t0 + k;
    size_t off = k * CE, n = k < K ? coll__min(CE, a->count - off) : 0;
    size_t mlo = ar_slice(me, P, n), mhi = ar_slice(me + 1, P, n);
    uint8_t *slot = NULL;
    if (k < K && !zc) { /* stage what peers reduce: all but my own slice */
      if ((rc = coll__stage(c, t, &slot)) != 0) return rc;
      coll__stage_copy(c, slot, send + off * es, mlo * es);
      coll__stage_copy(c, slot + mhi * es, send + (off + mhi) * es, (n - mhi) * es);
      coll__publish_staged(c, t, -1, t + 1); /* the result slice is read one round later */
    } else {
      coll__publish(c, t);
    }
    rc = k == 0 ? coll__meet_all(c, t0) : coll__wait_all(c, t);
    if (rc) return rc;
    if (k == 0 && zc && nbytes >= coll__push_min(c) && ar_all_in_arena(c)) {
      c->algorithm = "push";
      return ar_push(c, a, t0);
    }
    if (k < K) { /* reduce my slice of chunk k; my own part straight from send */
      for (int q = 0; q < P; q++) {
        uint64_t qoff = coll__peer_desc(c, q)->send_off;
        in[q] = (qoff ? coll__shared(c, qoff) + off * es : coll__peer_slot(c, q, t)) + mlo * es;
      }
      if (!zc) in[me] = send + (off + mlo) * es;
      uint8_t *out = zc ? recv + (off + mlo) * es : slot + mlo * es;
      if (mhi > mlo) coll_reduce_local(a->dtype, a->op, out, in, (size_t)P, mhi - mlo, (size_t)P);
    }
    if (k >= 1 && want) { /* gather the result slices of chunk k-1 */
      size_t offj = (k - 1) * CE, nj = coll__min(CE, a->count - offj);
      for (int q = 0; q < P; q++) {
        size_t lo = ar_slice(q, P, nj), hi = ar_slice(q + 1, P, nj);
        if (hi == lo || (q == me && zc)) continue;
        uint64_t qoff = coll__peer_desc(c, q)->recv_off;
        const uint8_t *src = qoff ? coll__shared(c, qoff) + (offj + lo) * es : coll__peer_slot(c, q, t - 1) + lo * es;
        coll__copy(c, recv + (offj + lo) * es, src, (hi - lo) * es, stream);
      }
    }
    coll__finish(c, t); /* peers refill the slots I read once they see this */
  }
  uint64_t last = t0 + K;
  coll__round_end(c, last);
  if (stream) coll__stream_fence();
  return zc ? coll__wait_all_finished(c, last) : 0;
}

int coll__allreduce(coll_comm_t *c, const coll_args_t *a) {
  size_t nbytes = a->count * coll_dtype_size(a->dtype);
  int algo = coll__forced_algo(c, a->kind);
  if (coll__tree_wanted(c, a->kind, a->count && nbytes <= coll__small_max(c) &&
                                        nbytes <= coll__slot_bytes(c))) {
    c->algorithm = "tree";
    return coll__reduce_tree(c, a);
  }
  if (algo && algo == coll__algo_id(a->kind, "tree")) algo = 0; /* too large for it: choose */
  if (a->count == 0 || (algo == 0 && nbytes <= coll__small_max(c))) {
    algo = AR_FLAT;
  } else if (algo == 0 && c->size == 2 && a->kind == COLL_ALLREDUCE) {
    c->algorithm = "flat";
    return ar_flat(c, a, 1);
  } else if (algo == 0) {
    algo = AR_RSAG;
  }
  c->algorithm = algo == AR_RSAG ? "rsag" : "flat"; /* rsag may turn to push (ar_rsag) */
  return algo == AR_RSAG ? ar_rsag(c, a) : ar_flat(c, a, 0);
}
