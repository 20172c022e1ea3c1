/*
 * hier.c - a job's collectives across nodes (hier.h): the layer's state, the meeting every call
 * starts with, and the collectives built from the two moves.
 *
 * The meeting. Each rank writes a block of one fixed size whatever the call: a head (its
 * descriptor: collective, dtype, count, op, root; a hint of node 0's local rank 0) and up to
 * `ride` bytes of data (hier.h). The node's ranks allgather their blocks over shared memory;
 * each of them checks the node's heads and makes the node's block (the first head, "agrees"
 * cleared where the node's ranks differ, and the node's data: its ranks' folded, or one rank's);
 * every ring allgathers the node blocks between the nodes (ceil(log2 nodes) steps), and ranks
 * beyond the rings get them from local rank 0. Ranks that disagree still exchange alike, so the
 * verdict is the same on every rank and the next call starts from the same place.
 *
 * bcast moves the root's bytes along each ring from the root's node (a chain, chunk by chunk:
 * every link carries them once), after a bcast in the root's node.
 * scatter is a bcast of the root's blocks, each rank keeping its own; reduce an allreduce whose
 * result only the root keeps; gather an allgather only the root keeps.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "coll_internal.h"
#include "hier.h"

typedef struct {
  uint8_t agrees; /* 1, or 0 where the node's ranks disagree */
  uint8_t hint;   /* node 0's local rank 0's proposal (the chunk count) */
  uint8_t pad[6];
  int32_t kind, dtype, op, root;
  uint64_t count;
} hier_head_t;
#define HIER_HEAD sizeof(hier_head_t)
#define HIER_SAME offsetof(hier_head_t, kind) /* heads agree from here on */
_Static_assert(HIER_HEAD == 32, "a head of 32 bytes");

/* The data that rides in a meeting block. Two nodes of one rank each move only a call's own bytes
 * (no node stage, and the one step between them sends just the head and the data), so there the
 * blocks may be as large as the ring's eager path takes; elsewhere every rank's block crosses
 * whole in the node and in all but the last step between nodes, so it stays small. Every rank
 * computes the same: the layout agrees, and so do the pools' sizes (COLL__NODES_POOL: nothing
 * sets another, and the join refuses a node of another protocol; the ring's slots depend on it
 * too). */
static size_t hier_ride(const coll__hier_t *h) {
  if (h->cfg.nodes != 2 || h->widest != 1) return COLL__HIER_SMALL;
  size_t most = coll__net_ring_eager_block(h->cfg.ring);
  most = most > HIER_HEAD + COLL__HIER_RIDE_2 ? COLL__HIER_RIDE_2 : (most - HIER_HEAD) & ~(size_t)63;
  return most > COLL__HIER_SMALL ? most : COLL__HIER_SMALL;
}
int coll__hier_rank(const coll__hier_t *h) { return h ? h->rank : -1; }
const char *coll__hier_algorithm(const coll__hier_t *h) { return h && h->algorithm ? h->algorithm : ""; }

static int hier_bad(char *err, size_t errlen, const char *what) {
  snprintf(err, errlen, "the layout across nodes does not add up: %s", what);
  return COLL_EBADARG;
}

static int hier_layout(coll__hier_t *h, char *err, size_t errlen) {
  const coll__hier_config_t *c = &h->cfg;
  int *per_node = calloc((size_t)c->nodes, sizeof *per_node);
  if (per_node == NULL) return -ENOMEM;
  int rc = 0;
  for (int r = 0; r < c->size && rc == 0; r++) {
    if (c->node_of[r] < 0 || c->node_of[r] >= c->nodes) rc = hier_bad(err, errlen, "a rank's node is out of range");
    else if (c->local_of[r] != per_node[c->node_of[r]]++) rc = hier_bad(err, errlen, "a node's ranks are not numbered in order");
  }
  int fewest = c->size, widest = 0;
  for (int k = 0; k < c->nodes && rc == 0; k++) {
    fewest = per_node[k] < fewest ? per_node[k] : fewest;
    widest = per_node[k] > widest ? per_node[k] : widest;
  }
  if (rc == 0 && fewest < 1) rc = hier_bad(err, errlen, "a node has no rank");
  if (rc == 0 && (c->rings < 1 || c->rings > fewest)) rc = hier_bad(err, errlen, "more rings than ranks on a node");
  h->widest = widest, h->even = 1;
  for (int k = 0; k < c->nodes && rc == 0; k++) h->even &= per_node[k] == c->rings;
  if (rc == 0 && per_node[c->node] != coll_comm_size(c->local))
    rc = hier_bad(err, errlen, "the node's communicator is not the node's ranks");
  free(per_node);
  return rc;
}

int coll__hier_make(const coll__hier_config_t *cfg, coll__hier_t **h_p, char *err, size_t errlen) {
  if (cfg == NULL || h_p == NULL || cfg->local == NULL || cfg->node_of == NULL || cfg->local_of == NULL ||
      cfg->size < 1 || cfg->nodes < 1 || cfg->node < 0 || cfg->node >= cfg->nodes)
    return hier_bad(err, errlen, "a missing part or a count out of range");
  coll__hier_t *h = calloc(1, sizeof *h);
  if (h == NULL) return -ENOMEM;
  h->cfg = *cfg;
  size_t n = (size_t)cfg->size;
  h->node_of = malloc(n * sizeof(int));
  h->local_of = malloc(n * sizeof(int));
  int rc = h->node_of && h->local_of ? 0 : -ENOMEM;
  if (rc == 0) {
    memcpy(h->node_of, cfg->node_of, n * sizeof(int));
    memcpy(h->local_of, cfg->local_of, n * sizeof(int));
    h->cfg.node_of = h->node_of, h->cfg.local_of = h->local_of;
    rc = hier_layout(h, err, errlen);
  }
  if (rc == 0) {
    int carries = cfg->nodes > 1 && coll_comm_rank(cfg->local) < cfg->rings;
    if (carries != (cfg->ring != NULL) || (cfg->ring && coll__net_ring_members(cfg->ring) != cfg->nodes))
      rc = hier_bad(err, errlen, "a ring where the rank carries none, or none where it does");
  }
  if (rc == 0) {
    h->local_rank = coll_comm_rank(cfg->local), h->local_size = coll_comm_size(cfg->local);
    h->ride = hier_ride(h), h->stride = HIER_HEAD + h->ride;
    h->fixed_chunks = cfg->local->params.pipeline_chunks; /* read where the node's ranks read theirs */
    h->sliced = h->even && cfg->rings > 1;
    int most = h->local_size > cfg->nodes ? h->local_size : cfg->nodes;
    h->rank_at = malloc((size_t)cfg->nodes * (size_t)h->widest * sizeof(int));
    h->inputs = malloc((size_t)most * sizeof *h->inputs);
    h->block = calloc(1, h->stride);
    h->rows = calloc((size_t)h->local_size, h->stride);
    h->blocks = calloc((size_t)cfg->nodes, h->stride);
    if (!h->rank_at || !h->inputs || !h->block || !h->rows || !h->blocks) rc = -ENOMEM;
  }
  if (rc == 0) {
    for (int i = 0; i < cfg->nodes * h->widest; i++) h->rank_at[i] = -1;
    for (int r = 0; r < cfg->size; r++) h->rank_at[h->node_of[r] * h->widest + h->local_of[r]] = r;
    h->rank = h->rank_at[cfg->node * h->widest + h->local_rank];
    h->rank_is_node = h->widest == 1;
    for (int r = 0; h->rank_is_node && r < cfg->size; r++) h->rank_is_node = h->node_of[r] == r;
  }
  if (rc != 0) {
    coll__hier_free(h);
    return rc;
  }
  *h_p = h;
  return 0;
}

void coll__hier_free(coll__hier_t *h) {
  if (h == NULL) return;
  coll__worker_end(&h->worker); /* queued requests end with COLL_EABORTED */
  for (int i = 0; i < 7; i++) free(h->scratch[i]);
  free(h->node_of), free(h->local_of), free(h->rank_at), free(h->inputs);
  free(h->block), free(h->rows), free(h->blocks);
  free(h);
}

void *coll__hier_scratch(coll__hier_t *h, int which, size_t bytes) {
  if (bytes <= h->scratch_bytes[which] && h->scratch[which]) return h->scratch[which]; /* (0 bytes: one page too) */
  size_t want = bytes < 4096 ? 4096 : bytes;
  void *p = NULL;
  if (posix_memalign(&p, 64, want) != 0) return NULL;
  free(h->scratch[which]);
  h->scratch[which] = p, h->scratch_bytes[which] = want;
  return p;
}

int coll__hier_local_failed(coll__hier_t *h, int rc, char *err, size_t errlen) {
  const char *text = NULL;
  if (coll_comm_error(h->cfg.local, &text) == 0 || text == NULL || !*text) text = coll_strerror(rc);
  snprintf(err, errlen, "%s", text);
  return rc;
}

int coll__hier_local(coll__hier_t *h, coll_kind_t kind, coll_dtype_t dtype, coll_op_t op, int root,
                     size_t count, const void *send, void *recv, char *err, size_t errlen) {
  coll_args_t a = {.kind = kind, .dtype = dtype, .op = op, .root = root, .count = count, .send = send, .recv = recv};
  int rc = coll_run(h->cfg.local, &a);
  return rc ? coll__hier_local_failed(h, rc, err, errlen) : 0;
}

/* ---- the meeting ---- */
static void hier_describe(const hier_head_t *hd, char *out, size_t len) {
  snprintf(out, len, "%s of %s x %llu, op %s, root %d", coll_kind_name((coll_kind_t)hd->kind),
           coll_dtype_name((coll_dtype_t)hd->dtype), (unsigned long long)hd->count,
           coll_op_name((coll_op_t)hd->op), hd->root);
}

static int hier_verdict(coll__hier_t *h, const hier_head_t *mine, char *err, size_t errlen) {
  char me[160], them[160];
  hier_describe(mine, me, sizeof me);
  for (int k = 0; k < h->cfg.nodes; k++) {
    const uint8_t *b = h->blocks + (size_t)k * h->stride;
    const hier_head_t *hd = (const hier_head_t *)b;
    if (!hd->agrees) {
      snprintf(err, errlen, "ranks disagree on the arguments of %s: the ranks of node %d call different ones (this "
               "rank, %d on node %d: %s); every rank must call the same collectives in the same order with the same "
               "arguments", coll_kind_name((coll_kind_t)mine->kind), k, h->rank, h->cfg.node, me);
      return COLL_EMISMATCH;
    }
    if (memcmp(b + HIER_SAME, (const uint8_t *)mine + HIER_SAME, HIER_HEAD - HIER_SAME) != 0) {
      hier_describe(hd, them, sizeof them);
      snprintf(err, errlen, "ranks disagree on the arguments of %s: node %d calls %s, this rank (%d on node %d) %s; "
               "every rank must call the same collectives in the same order with the same arguments",
               coll_kind_name((coll_kind_t)mine->kind), k, them, h->rank, h->cfg.node, me);
      return COLL_EMISMATCH;
    }
  }
  return 0;
}

/* The node's data part: its ranks' data folded in local rank order, or one rank's. Local rank
 * l's data is in its row of the node's allgather, or, alone on the node, `data` itself. */
static int hier_node_part(coll__hier_t *h, const coll_args_t *a, const uint8_t *rows, const void *data, size_t len,
                          coll__hier_part_t part, int pick, uint8_t *into) {
  for (int l = 0; l < h->local_size; l++) h->inputs[l] = h->local_size > 1 ? rows + (size_t)l * h->stride + HIER_HEAD : data;
  if (part == HIER_PART_PICK && h->inputs[pick] != NULL) {
    memcpy(into, h->inputs[pick], len);
  } else if (part == HIER_PART_FOLD) {
    coll_op_t op = a->op == COLL_AVG ? COLL_SUM : a->op;
    return coll_reduce_local(a->dtype, op, into, h->inputs, (size_t)h->local_size, a->count, 1);
  }
  return 0;
}

int coll__hier_meet(coll__hier_t *h, const coll_args_t *a, const void *data, size_t len,
                    coll__hier_part_t part, int pick, uint8_t hint, const uint8_t **parts_p, char *err,
                    size_t errlen) {
  if (len > h->ride) return COLL_EBADARG;
  hier_head_t *head = (hier_head_t *)h->block;
  memset(head, 0, HIER_HEAD);
  *head = (hier_head_t){.agrees = 1, .hint = hint, .kind = (int32_t)a->kind, .dtype = (int32_t)a->dtype,
                        .op = (int32_t)a->op, .root = a->root, .count = a->count};
  const uint8_t *rows = h->block;
  int rc;
  if (h->local_size > 1) {
    if (data != NULL && len) memcpy(h->block + HIER_HEAD, data, len);
    rc = coll__hier_local(h, COLL_ALLGATHER, COLL_UINT8, COLL_SUM, 0, h->stride, h->block, h->rows, err, errlen);
    if (rc) return rc;
    rows = h->rows;
  }
  uint8_t *mine = h->blocks + (size_t)h->cfg.node * h->stride;
  memcpy(mine, rows, HIER_HEAD);
  for (int l = 1; l < h->local_size; l++)
    if (memcmp(rows + (size_t)l * h->stride + HIER_SAME, rows + HIER_SAME, HIER_HEAD - HIER_SAME) != 0)
      ((hier_head_t *)mine)->agrees = 0;
  if (((hier_head_t *)mine)->agrees && hier_node_part(h, a, rows, data, len, part, pick, mine + HIER_HEAD) != 0)
    ((hier_head_t *)mine)->agrees = 0; /* a dtype or op the fold refuses: a disagreement too */
  if (h->cfg.ring != NULL) {
    /* only the head and this call's data matter, and none of the data of a node without a part (a
     * bcast's other nodes): a small call's step is one injected transfer (a node whose call differs
     * in length says so in its head, which always goes) */
    size_t own = HIER_HEAD + (part != HIER_PART_NONE ? len : 0);
    rc = coll__net_ring_allgather_used(h->cfg.ring, h->blocks, h->stride, HIER_HEAD + len, own, h->cfg.timeout_s,
                                       err, errlen);
    if (rc) return rc;
  }
  if (h->cfg.nodes > 1 && h->cfg.rings < h->local_size) {
    rc = coll__hier_local(h, COLL_BCAST, COLL_UINT8, COLL_SUM, 0, (size_t)h->cfg.nodes * h->stride, h->blocks,
                          h->blocks, err, errlen);
    if (rc) return rc;
  }
  rc = hier_verdict(h, head, err, errlen);
  if (rc) return rc;
  h->hint = ((const hier_head_t *)h->blocks)->hint;
  if (parts_p) *parts_p = h->blocks + HIER_HEAD;
  return 0;
}

int coll__hier_agree(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  h->algorithm = "meeting";
  return coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, 0, NULL, err, errlen);
}

/* ---- bcast and the collectives made of the others ---- */
/* The root's bytes [0, bytes) of buf (a->root's, the job's rank) to every rank, in place. */
static int hier_bcast(coll__hier_t *h, const coll_args_t *a, uint8_t *buf, size_t bytes, char *err, size_t errlen) {
  int node = h->node_of[a->root], local_root = h->local_of[a->root];
  if (bytes <= h->ride) { /* the root's bytes ride with the descriptors */
    const uint8_t *parts;
    int here = node == h->cfg.node;
    int rc = coll__hier_meet(h, a, h->rank == a->root ? buf : NULL, bytes, here ? HIER_PART_PICK : HIER_PART_NONE,
                             local_root, 0, &parts, err, errlen);
    if (rc) return rc;
    if (node != h->cfg.node || h->rank != a->root) memcpy(buf, parts + (size_t)node * h->stride, bytes);
    h->algorithm = "meeting";
    return 0;
  }
  int rc = coll__hier_meet(h, a, NULL, 0, HIER_PART_NONE, 0, 0, NULL, err, errlen);
  if (rc) return rc;
  h->algorithm = "rings";
  if (node == h->cfg.node && h->local_size > 1)
    rc = coll__hier_local(h, COLL_BCAST, COLL_UINT8, COLL_SUM, local_root, bytes, buf, buf, err, errlen);
  return rc ? rc : coll__hier_bcast_across(h, buf, bytes, node, err, errlen);
}

static int hier_scatter(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  size_t b = a->count * coll_dtype_size(a->dtype), all = b * (size_t)h->cfg.size;
  uint8_t *whole = coll__hier_scratch(h, HIER_SCR_CALL, all);
  if (whole == NULL) return -ENOMEM;
  if (h->rank == a->root && all) memcpy(whole, a->send, all);
  int rc = hier_bcast(h, a, whole, all, err, errlen);
  if (rc == 0 && (const uint8_t *)a->recv != (const uint8_t *)a->send + (size_t)h->rank * b)
    memcpy(a->recv, whole + (size_t)h->rank * b, b);
  return rc;
}

static int hier_check(const coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  int rooted = a->kind == COLL_BCAST || a->kind == COLL_GATHER || a->kind == COLL_SCATTER || a->kind == COLL_REDUCE;
  if (a->kind < 0 || a->kind >= COLL_KIND_COUNT) snprintf(err, errlen, "an unknown collective");
  else if (coll_dtype_size(a->dtype) == 0) snprintf(err, errlen, "an unknown dtype");
  else if (a->op < 0 || a->op >= COLL_OP_COUNT) snprintf(err, errlen, "an unknown op");
  else if (rooted && (a->root < 0 || a->root >= h->cfg.size))
    snprintf(err, errlen, "root %d is not a rank of this communicator (size %d)", a->root, h->cfg.size);
  else if (a->count > ((size_t)1 << 40))
    snprintf(err, errlen, "a count of %zu elements", a->count);
  else
    return 0;
  return COLL_EBADARG;
}

static int hier_exec(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  size_t es = coll_dtype_size(a->dtype);
  switch (a->kind) {
  case COLL_BARRIER:
    return coll__hier_agree(h, a, err, errlen);
  case COLL_ALLREDUCE:
    return coll__hier_allreduce(h, a, a->recv, err, errlen);
  case COLL_REDUCE: {
    void *out = h->rank == a->root ? a->recv : coll__hier_scratch(h, HIER_SCR_CALL, a->count * es);
    return out ? coll__hier_allreduce(h, a, out, err, errlen) : -ENOMEM;
  }
  case COLL_BCAST:
    return hier_bcast(h, a, a->recv, a->count * es, err, errlen);
  case COLL_SCATTER:
    return hier_scatter(h, a, err, errlen);
  case COLL_ALLGATHER:
    return coll__hier_allgather(h, a, a->recv, err, errlen);
  case COLL_GATHER: {
    void *out = h->rank == a->root ? a->recv : coll__hier_scratch(h, HIER_SCR_CALL, a->count * es * (size_t)h->cfg.size);
    return out ? coll__hier_allgather(h, a, out, err, errlen) : -ENOMEM;
  }
  case COLL_REDUCE_SCATTER:
    return coll__hier_reduce_scatter(h, a, err, errlen);
  case COLL_ALLTOALL:
    return coll__hier_alltoall(h, a, err, errlen);
  default:
    return COLL_EBADARG;
  }
}

void coll__hier_fail(coll__hier_t *h, int code, const char *text) {
  int none = 0;
  if (!atomic_compare_exchange_strong(&h->failed, &none, code)) return; /* the first failure stands */
  snprintf(h->fail_text, sizeof h->fail_text, "%s", text && *text ? text : coll_strerror(code));
  coll__fail(h->cfg.local, code, "%s", h->fail_text); /* the node's ranks leave their waits */
  if (h->cfg.watch_fd >= 0) shutdown(h->cfg.watch_fd, SHUT_RDWR); /* and the other nodes' */
}

/* A call's end: a failure but a disagreement or a bad argument ends the job's communicator. */
static int hier_settle(coll__hier_t *h, int rc, const char *err) {
  if (rc != 0 && rc != COLL_EMISMATCH && rc != COLL_EBADARG) coll__hier_fail(h, rc, err);
  return rc;
}

static int hier_failed(coll__hier_t *h, char *err, size_t errlen) {
  int rc = atomic_load(&h->failed);
  if (rc) snprintf(err, errlen, "%s", h->fail_text);
  return rc;
}

int coll__hier_run(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen) {
  if (h == NULL || a == NULL) return COLL_EBADARG;
  int rc = hier_failed(h, err, errlen);
  if (rc == 0) rc = hier_check(h, a, err, errlen);
  if (rc) return rc;
  return hier_settle(h, hier_exec(h, a, err, errlen), err);
}

static int hier_execute(void *owner, const coll_args_t *a) { /* on the request engine's thread */
  coll__hier_t *h = owner;
  char err[320] = "";
  int rc = hier_failed(h, err, sizeof err);
  return rc ? rc : hier_settle(h, hier_exec(h, a, err, sizeof err), err);
}

int coll__hier_start(coll__hier_t *h, const coll_args_t *a, coll_req_t **req_p, char *err, size_t errlen) {
  if (h == NULL || a == NULL || req_p == NULL) return COLL_EBADARG;
  int rc = hier_failed(h, err, errlen);
  if (rc == 0) rc = hier_check(h, a, err, errlen);
  if (rc == 0) rc = coll__worker_get(&h->worker, hier_execute, h);
  return rc ? rc : coll__worker_queue(h->worker, a, req_p);
}

int coll__hier_failure(coll__hier_t *h, const char **text_p) {
  int rc = atomic_load(&h->failed);
  if (text_p) *text_p = rc ? h->fail_text : "";
  return rc;
}

int coll__hier_pending(coll__hier_t *h) { return h ? coll__worker_pending(h->worker) : 0; }
