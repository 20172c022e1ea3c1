/*
 * stage_probe.c - whether copies into the staging slots use streaming stores, measured when a
 * communicator is made.
 *
 * A staged collective copies a chunk into its slot and a peer reads it from there. Written with
 * ordinary stores, the chunk sits dirty in the writer's cache and the reader's loads fetch it
 * from that cache; written with streaming stores, it goes to memory and the reader loads it from
 * there. Which is faster depends on the machine. On the AMD EPYC VM of bench/README.md ("A host
 * that moves its vCPUs apart") streaming made a 64 KiB bcast 1.8x faster; and for seconds at a time,
 * several times a minute, the hypervisor ran the two vCPUs where cache-to-cache reads were 4x
 * slower, which streamed chunks did not feel. Where caches pass lines quickly, streaming only
 * adds memory traffic. So a new communicator measures it: bcasts of PROBE_BYTES from rank 0,
 * ordinary and streaming in turn, each batch timed to a barrier; rank 0 keeps streaming only if
 * its best batch was clearly faster, and every rank takes rank 0's answer. About 0.3 ms on two
 * ranks. HBMCOLL_STAGE_STREAM_MIN set to a size: no probe, that size.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "coll_internal.h"
#include "core_share.h"
#include "round.h"

#define PROBE_BYTES ((size_t)32 << 10) /* where streaming starts when it wins */
#define PROBE_CALLS 4
#define PROBE_ROUNDS 3
#define PROBE_MARGIN 0.9 /* streaming's best batch at most this share of the ordinary one's */

int coll__probe_batch(coll_comm_t *c, const coll_args_t *a, int calls, double *best) {
  coll_args_t barrier = {.kind = COLL_BARRIER};
  double t0 = coll__core_now();
  int rc = 0;
  for (int i = 0; i < calls && rc == 0; i++) rc = coll__execute(c, a);
  if (rc == 0) rc = coll__execute(c, &barrier);
  double t = coll__core_now() - t0;
  if (t < *best) *best = t;
  return rc;
}

static int probe_batch(coll_comm_t *c, void *buf, int stream, double *best) {
  c->params.stage_stream_min = stream ? PROBE_BYTES : SIZE_MAX; /* only the root's copies count */
  coll_args_t bcast = {.kind = COLL_BCAST, .dtype = COLL_UINT8, .count = PROBE_BYTES, .recv = buf};
  return coll__probe_batch(c, &bcast, PROBE_CALLS, best);
}

/* Whether a probe would measure anything, from what every rank sees alike (rank 0's
 * variables in the header, the agreed single copy): a 32 KiB bcast must stage through
 * coll__stage_copy, every rank needs a CPU of its own (else the times are the scheduler's),
 * and streaming stores must exist (stream_copy.c). */
static int probe_useful(const coll_comm_t *c) {
#if defined(__x86_64__)
  int small = PROBE_BYTES <= coll__small_max(c) && PROBE_BYTES <= coll__slot_bytes(c);
  return c->hdr->stage_auto && c->size > 1 && coll__roomy(c) && coll__slot_bytes(c) >= PROBE_BYTES &&
         (small || !coll__single_copy_from(c, COLL_BCAST, PROBE_BYTES));
#else
  (void)c;
  return 0;
#endif
}

size_t coll_comm_stage_streaming(const coll_comm_t *c, double times_s[2]) {
  c = coll__comm_here(c); /* across nodes: what this node's stages chose */
  if (times_s) times_s[0] = c && isfinite(c->stage_probe_s[0]) ? c->stage_probe_s[0] : 0,
               times_s[1] = c && isfinite(c->stage_probe_s[1]) ? c->stage_probe_s[1] : 0;
  return c && c->params.stage_stream_min != SIZE_MAX ? c->params.stage_stream_min : 0;
}

int coll__stage_probe(coll_comm_t *c) {
  if (c->parent && c->hdr->stage_auto) { /* a split's ranks are on the parent's cores */
    c->params.stage_stream_min = c->parent->params.stage_stream_min;
    return 0;
  }
  if (!probe_useful(c)) {
    if (c->hdr->stage_auto) c->params.stage_stream_min = SIZE_MAX; /* rank 0 asked: nobody streams */
    return 0;
  }
  /* without memory a rank still takes part (or the others would wait): its bytes are
   * never looked at, so any buffer does, shared or not */
  static uint8_t spare[PROBE_BYTES];
  void *buf = calloc(1, PROBE_BYTES);
  double best[2] = {INFINITY, INFINITY};
  int rc = 0;
  for (int r = 0; r < PROBE_ROUNDS && rc == 0; r++)
    for (int stream = 0; stream < 2 && rc == 0; stream++)
      rc = probe_batch(c, buf ? buf : spare, stream, &best[stream]);
  free(buf);
  uint64_t choice = best[1] < PROBE_MARGIN * best[0] ? PROBE_BYTES : SIZE_MAX;
  coll_args_t say = {.kind = COLL_BCAST, .dtype = COLL_INT64, .count = 1, .recv = &choice};
  coll_args_t barrier = {.kind = COLL_BARRIER}; /* the root of `say` learns of trouble here */
  if (rc == 0) rc = coll__execute(c, &say);
  if (rc == 0) rc = coll__execute(c, &barrier);
  c->params.stage_stream_min = rc == 0 ? (size_t)choice : SIZE_MAX;
  c->stage_probe_s[0] = best[0];
  c->stage_probe_s[1] = best[1];
  return rc;
}
