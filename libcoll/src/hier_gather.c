/*
 * hier_gather.c - the collectives across nodes that gather or exchange blocks (hier.h).
 *
 * The gather across: the node's block of bytes (the same on every local rank) is cut in R
 * slices; carrier l puts slice l at its node's place in a row of every node's slice l, and ring
 * l allgathers that row between the nodes; a local allgather of the rows brings every node's
 * block to every local rank.
 *
 * allgather is a local allgather (the node's block: its ranks' blocks, padded to the widest
 * node's), a gather across, and each rank's block picked out by rank; with one rank per node,
 * blocks of up to `ride` bytes go in the meeting, and larger ones, ranks in node order, the
 * ring allgathers straight in the result.
 *
 * reduce_scatter, where every node has one rank per ring: local rank l of node k takes, from its
 * node's reduce-scatter, the blocks of local rank l of every node (node by node), reduced over the
 * node; ring l reduce-scatters those and member k keeps segment k: its own block. Half the ring's
 * bytes of an allreduce and no allgather in the node. Elsewhere, or up to COLL__HIER_SMALL bytes,
 * its part of an allreduce.
 *
 * alltoall: the blocks for the node's own ranks go by a local alltoall. Where every node has one
 * rank per ring, the others go by shifts: in step j each rank sends its blocks for node + j's
 * ranks to its ring's member there and gets node - j's, so each block crosses once, and a local
 * alltoall hands them to their ranks. Elsewhere each node's blocks for the other nodes travel in
 * a gather across, each rank taking its own.
 */
#include <errno.h>
#include <string.h>

#include "hier.h"

int coll__hier_gather_across(coll__hier_t *h, const uint8_t *raw, size_t bytes, uint8_t *every, char *err,
                             size_t errlen) {
  size_t R = (size_t)h->cfg.rings, L = (size_t)h->local_size, N = (size_t)h->cfg.nodes;
  size_t me = (size_t)h->local_rank, node = (size_t)h->cfg.node, S = (bytes + R - 1) / R;
  if (S == 0) return 0;
  uint8_t *piece = coll__hier_scratch(h, HIER_SCR_PIECE, N * S);
  uint8_t *rows = L > 1 ? coll__hier_scratch(h, HIER_SCR_EVERY, L * N * S) : piece;
  if (piece == NULL || rows == NULL) return -ENOMEM;
  int rc = 0;
  if (me < R) {
    size_t lo = me * S, hi = lo + S < bytes ? lo + S : bytes;
    memcpy(piece + node * S, raw + lo, hi - lo);
    if (N > 1) rc = coll__net_ring_allgather(h->cfg.ring, piece, S, h->cfg.timeout_s, err, errlen);
  }
  if (rc == 0 && L > 1) rc = coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, N * S, piece, rows, err, errlen);
  if (rc) return rc;
  for (size_t k = 0; k < N; k++)
    for (size_t l = 0; l < R && l * S < bytes; l++) {
      size_t len = l * S + S < bytes ? S : bytes - l * S;
      memcpy(every + k * bytes + l * S, rows + l * N * S + k * S, len);
    }
  return 0;
}

/* One rank per node and a block that rides: each rank's block goes with its descriptor. Mine is
 * taken from the meeting's copy too, as send may overlap out anywhere (a call across nodes gets
 * no private copy of an aliased input). */
static int hier_allgather_met(coll__hier_t *h, const coll_args_t *a, uint8_t *out, size_t b, char *err,
                              size_t errlen) {
  const uint8_t *parts;
  int rc = coll__hier_meet(h, a, a->send, b, HIER_PART_PICK, 0, 0, &parts, err, errlen);
  if (rc || b == 0) return rc;
  h->algorithm = "meeting";
  for (int k = 0; k < h->cfg.nodes; k++) memcpy(out + (size_t)h->rank_at[k] * b, parts + (size_t)k * h->stride, b);
  return 0;
}

int coll__hier_allgather(coll__hier_t *h, const coll_args_t *a, void *out, char *err, size_t errlen) {
  size_t b = a->count * coll_dtype_size(a->dtype), W = (size_t)h->widest, N = (size_t)h->cfg.nodes;
  if (W == 1 && b <= h->ride) return hier_allgather_met(h, a, out, b, err, errlen);
  int rc = coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, 0, NULL, err, errlen);
  if (rc || b == 0) return rc;
  h->algorithm = "gather";
  if (h->rank_is_node) { /* the ring's rows are the result's */
    uint8_t *mine_out = (uint8_t *)out + (size_t)h->cfg.node * b;
    if (mine_out != (const uint8_t *)a->send) memmove(mine_out, a->send, b);
    return N > 1 ? coll__net_ring_allgather(h->cfg.ring, out, b, h->cfg.timeout_s, err, errlen) : 0;
  }
  uint8_t *mine = coll__hier_scratch(h, HIER_SCR_MINE, W * b), *every = coll__hier_scratch(h, HIER_SCR_ALL, N * W * b);
  if (mine == NULL || every == NULL) return -ENOMEM;
  if (h->local_size > 1)
    rc = coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, b, a->send, mine, err, errlen);
  else
    memcpy(mine, a->send, b);
  if (rc == 0) rc = coll__hier_gather_across(h, mine, W * b, every, err, errlen);
  if (rc) return rc;
  for (int r = 0; r < h->cfg.size; r++)
    memcpy((uint8_t *)out + (size_t)r * b, every + ((size_t)h->node_of[r] * W + (size_t)h->local_of[r]) * b, b);
  return 0;
}

int coll__hier_reduce_scatter(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  size_t es = coll_dtype_size(a->dtype), b = a->count * es, P = (size_t)h->cfg.size;
  size_t L = (size_t)h->local_size, N = (size_t)h->cfg.nodes;
  coll_op_t base = a->op == COLL_AVG ? COLL_SUM : a->op;
  const uint8_t *send = a->send;
  int rc = coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, 0, NULL, err, errlen);
  if (rc) return rc;
  if (h->even && N > 1 && P * b > COLL__HIER_SMALL) {
    h->algorithm = "rings";
    uint8_t *mine = coll__hier_scratch(h, HIER_SCR_MINE, L * N * b);
    uint8_t *piece = L > 1 ? coll__hier_scratch(h, HIER_SCR_ALL, N * b) : mine;
    if (mine == NULL || piece == NULL) return -ENOMEM;
    for (size_t l = 0; l < L; l++)
      for (size_t k = 0; k < N; k++)
        memcpy(mine + (l * N + k) * b, send + (size_t)h->rank_at[k * (size_t)h->widest + l] * b, b);
    if (L > 1) rc = coll__hier_local(h, COLL_REDUCE_SCATTER, a->dtype, base, 0, N * a->count, mine, piece, err, errlen);
    if (rc == 0)
      rc = coll__net_ring_reduce_scatter(h->cfg.ring, a->dtype, base, piece, N * a->count, h->cfg.timeout_s, err, errlen);
    if (rc == 0) memcpy(a->recv, piece + (size_t)h->cfg.node * b, b);
  } else {
    uint8_t *whole = coll__hier_scratch(h, HIER_SCR_CALL, P * b);
    if (whole == NULL) return -ENOMEM;
    rc = coll__hier_allreduce_met(h, send, whole, P * a->count, a->dtype, base, err, errlen);
    if (rc == 0) memcpy(a->recv, whole + (size_t)h->rank * b, b);
  }
  if (rc == 0 && a->op == COLL_AVG) {
    const void *in[1] = {a->recv};
    rc = coll_reduce_local(a->dtype, COLL_AVG, a->recv, in, 1, a->count, P);
  }
  return rc;
}

/* Where every node has one rank per ring: the blocks for the other nodes by the ring's shifts. */
static int hier_by_shifts(coll__hier_t *h, const uint8_t *src, uint8_t *dst, size_t b, char *err, size_t errlen) {
  size_t L = (size_t)h->local_size, N = (size_t)h->cfg.nodes, node = (size_t)h->cfg.node, W = (size_t)h->widest;
  uint8_t *out = coll__hier_scratch(h, HIER_SCR_PIECE, L * b);
  uint8_t *got = coll__hier_scratch(h, HIER_SCR_CALL, (N - 1) * L * b); /* [j - 1][l] from node - j */
  uint8_t *mine = coll__hier_scratch(h, HIER_SCR_MINE, L * (N - 1) * b);
  uint8_t *back = coll__hier_scratch(h, HIER_SCR_ALL, L * (N - 1) * b);
  if (!out || !got || !mine || !back) return -ENOMEM;
  int rc = 0;
  for (size_t j = 1; j < N && rc == 0; j++) {
    size_t to = (node + j) % N;
    for (size_t l = 0; l < L; l++) memcpy(out + l * b, src + (size_t)h->rank_at[to * W + l] * b, b);
    rc = coll__net_ring_shift(h->cfg.ring, (int)j, out, got + (j - 1) * L * b, L * b, h->cfg.timeout_s, err, errlen);
  }
  if (rc) return rc;
  for (size_t l = 0; l < L; l++) /* what local rank l gets from me: [l][j - 1] */
    for (size_t j = 1; j < N; j++) memcpy(mine + (l * (N - 1) + j - 1) * b, got + ((j - 1) * L + l) * b, b);
  if (L > 1) rc = coll__hier_local(h, COLL_ALLTOALL, COLL_UINT8, COLL_SUM, 0, (N - 1) * b, mine, back, err, errlen);
  else back = mine;
  if (rc) return rc;
  for (size_t l = 0; l < L; l++) /* [l][j - 1]: from local rank l's peer on node - j */
    for (size_t j = 1; j < N; j++)
      memcpy(dst + (size_t)h->rank_at[((node + N - j) % N) * W + l] * b, back + (l * (N - 1) + j - 1) * b, b);
  return 0;
}

/* Where nodes differ in ranks: every node's blocks for the other nodes in one gather across. */
static int hier_by_gather(coll__hier_t *h, const uint8_t *src, uint8_t *dst, size_t b, char *err, size_t errlen) {
  size_t P = (size_t)h->cfg.size, L = (size_t)h->local_size, N = (size_t)h->cfg.nodes, W = (size_t)h->widest;
  size_t width = 0, away = P - L;
  for (size_t k = 0; k < N; k++) {
    size_t n = 0;
    while (n < W && h->rank_at[k * W + n] >= 0) n++;
    width = n * (P - n) * b > width ? n * (P - n) * b : width;
  }
  uint8_t *mine = coll__hier_scratch(h, HIER_SCR_MINE, away * b);
  uint8_t *block = coll__hier_scratch(h, HIER_SCR_ALL, width > L * away * b ? width : L * away * b);
  uint8_t *every = coll__hier_scratch(h, HIER_SCR_OUT, N * width);
  if (!mine || !block || !every) return -ENOMEM;
  size_t i = 0;
  for (size_t r = 0; r < P; r++)
    if (h->node_of[r] != h->cfg.node) memcpy(mine + b * i++, src + r * b, b);
  int rc = 0;
  if (L > 1) rc = coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, away * b, mine, block, err, errlen);
  else memcpy(block, mine, away * b);
  if (rc == 0) rc = coll__hier_gather_across(h, block, width, every, err, errlen);
  if (rc) return rc;
  for (size_t k = 0; k < N; k++) {
    if ((int)k == h->cfg.node) continue;
    size_t n = 0, idx = 0; /* node k's ranks, and my place among the ranks not on node k */
    while (n < W && h->rank_at[k * W + n] >= 0) n++;
    for (int r = 0; r < h->rank; r++) idx += h->node_of[r] != (int)k;
    for (size_t l = 0; l < n; l++)
      memcpy(dst + (size_t)h->rank_at[k * W + l] * b, every + k * width + (l * (P - n) + idx) * b, b);
  }
  return 0;
}

int coll__hier_alltoall(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  size_t b = a->count * coll_dtype_size(a->dtype), L = (size_t)h->local_size, W = (size_t)h->widest;
  size_t node = (size_t)h->cfg.node;
  const uint8_t *src = a->send;
  uint8_t *dst = a->recv;
  int rc = coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, 0, NULL, err, errlen);
  if (rc || b == 0) return rc;
  h->algorithm = h->even ? "shifts" : "gather";
  if (src == dst) { /* in place: the blocks out go from a copy */
    uint8_t *copy = coll__hier_scratch(h, HIER_SCR_COPY, (size_t)h->cfg.size * b);
    if (copy == NULL) return -ENOMEM;
    src = memcpy(copy, src, (size_t)h->cfg.size * b);
  }
  if (L > 1) {
    uint8_t *here = coll__hier_scratch(h, HIER_SCR_MINE, L * b), *got = coll__hier_scratch(h, HIER_SCR_ALL, L * b);
    if (here == NULL || got == NULL) return -ENOMEM;
    for (size_t l = 0; l < L; l++) memcpy(here + l * b, src + (size_t)h->rank_at[node * W + l] * b, b);
    rc = coll__hier_local(h, COLL_ALLTOALL, COLL_UINT8, COLL_SUM, 0, b, here, got, err, errlen);
    if (rc) return rc;
    for (size_t l = 0; l < L; l++) memcpy(dst + (size_t)h->rank_at[node * W + l] * b, got + l * b, b);
  } else {
    memcpy(dst + (size_t)h->rank * b, src + (size_t)h->rank * b, b);
  }
  if (h->cfg.nodes == 1) return 0;
  return h->even ? hier_by_shifts(h, src, dst, b, err, errlen) : hier_by_gather(h, src, dst, b, err, errlen);
}
