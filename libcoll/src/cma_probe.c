/*
 * cma_probe.c - whether a large gather copies once (cma.c) or stages, measured when a
 * communicator is made (HBMCOLL_CMA=auto, the default).
 *
 * Single copy saves a gather's second copy but makes the kernel pin the root's pages for every
 * write; which costs more depends on the machine (bench/README.md has hosts where it lost and
 * hosts where it won at every size from 256 KiB). So where single copy works between every pair,
 * a new communicator times gathers of 1 MiB a rank (or HBMCOLL_CMA_MIN, if larger), staged and
 * single copy in turn, each batch timed to a barrier; rank 0 keeps single copy (from
 * HBMCOLL_CMA_MIN on) unless staging's best batch was clearly faster, and every rank takes rank
 * 0's answer. A few milliseconds on two ranks. Near a tie single copy stays: it moves half the
 * bytes, and the probe's buffers, used again and again, sit in cache as a large gather's rarely
 * do, which flatters staging's second copy (bench/README.md has the times; where single copy
 * lost, staging was 25% faster). Without a CPU per rank the times would be the scheduler's,
 * and staging needs both ranks on a CPU at once where single copy does not, so there single
 * copy stays without a probe.
 * bcast is not probed: its staged root returns while the receivers copy, which single copy
 * loses (python -m hbmcoll.tune measures it, and HBMCOLL_CMA=1 or =bcast asks for it).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "round.h"

#define PROBE_MIN ((size_t)1 << 20) /* a large gather's time, whatever HBMCOLL_CMA_MIN says */
#define PROBE_MAX ((size_t)4 << 20) /* above: not probed, the verdict stays (memory: P times it) */
#define PROBE_CALLS 4
#define PROBE_ROUNDS 4
#define PROBE_MARGIN 0.9 /* staging's best batch must be under this share of single copy's */

static int probe_batch(coll_comm_t *c, const void *send, void *recv, size_t bytes, int single,
                       double *best) {
  c->cma = single;
  coll_args_t gather = {.kind = COLL_GATHER, .dtype = COLL_UINT8, .count = bytes, .send = send, .recv = recv};
  return coll__probe_batch(c, &gather, PROBE_CALLS, best);
}

/* The size a probe gathers per rank: large, from where single copy would start, past the eager
 * path. */
static size_t probe_bytes(const coll_comm_t *c) {
  size_t n = c->hdr->cma_min > PROBE_MIN ? c->hdr->cma_min : PROBE_MIN;
  if (n <= coll__small_max(c)) n = coll__small_max(c) + 1;
  return (n + 4095) & ~(size_t)4095;
}

/* Every rank's buffers, or none (*ok 0 on every rank when one is short of memory). */
static int probe_buffers(coll_comm_t *c, size_t bytes, uint8_t **send, uint8_t **recv, int32_t *ok) {
  *send = malloc(bytes);
  *recv = c->rank == 0 ? malloc(bytes * (size_t)c->size) : NULL;
  *ok = *send && (c->rank != 0 || *recv);
  if (*send) memset(*send, c->rank, bytes);
  if (*recv) memset(*recv, 0, bytes * (size_t)c->size); /* first touch outside the timing */
  coll_args_t all = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_MIN, .count = 1,
                     .send = ok, .recv = ok};
  return coll__execute(c, &all);
}

size_t coll_comm_single_copy_probe(const coll_comm_t *c, double times_s[2]) {
  c = coll__comm_here(c); /* across nodes: what this node's stages chose */
  if (times_s) times_s[0] = c ? c->cma_probe_s[0] : 0, times_s[1] = c ? c->cma_probe_s[1] : 0;
  return c ? c->cma_probe_bytes : 0;
}

int coll__cma_probe(coll_comm_t *c) {
  if (!c->hdr->cma_auto || !c->cma) return 0; /* the verdict is the same on every rank */
  if (c->parent && c->parent->cma_probe_bytes) { /* a split's ranks are on the parent's cores */
    c->cma = c->parent->cma;
    c->cma_probe_bytes = c->parent->cma_probe_bytes;
    memcpy(c->cma_probe_s, c->parent->cma_probe_s, sizeof c->cma_probe_s);
    return 0;
  }
  size_t bytes = probe_bytes(c);
  if (c->size < 2 || !coll__roomy(c) || bytes > PROBE_MAX) return 0;
  uint8_t *send, *recv;
  int32_t ok;
  int rc = probe_buffers(c, bytes, &send, &recv, &ok);
  double best[2] = {INFINITY, INFINITY};
  for (int r = 0; r < PROBE_ROUNDS && rc == 0 && ok; r++)
    for (int k = 0; k < 2 && rc == 0; k++) { /* each first in turn: the first after a switch pays for it */
      int single = (r + k) % 2;
      rc = probe_batch(c, send, recv, bytes, single, &best[single]);
    }
  free(send);
  free(recv);
  /* rank 0's choice and times for all (no memory to measure: staged) */
  double said[3] = {ok && !(best[0] < PROBE_MARGIN * best[1]), best[0], best[1]};
  c->cma = 0; /* said travels staged */
  coll_args_t say = {.kind = COLL_BCAST, .dtype = COLL_FLOAT64, .count = 3, .recv = said};
  coll_args_t barrier = {.kind = COLL_BARRIER}; /* the root of `say` learns of trouble here */
  if (rc == 0) rc = coll__execute(c, &say);
  if (rc == 0) rc = coll__execute(c, &barrier);
  c->cma = rc == 0 && said[0] == 1;
  int measured = rc == 0 && ok;
  c->cma_probe_bytes = measured ? bytes : 0;
  c->cma_probe_s[0] = measured ? said[1] : 0;
  c->cma_probe_s[1] = measured ? said[2] : 0;
  return rc;
}
