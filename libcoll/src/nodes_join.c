/*
 * nodes_join.c - who is on which node, and the bridge's rings between the nodes, for coll_job_create
 * and the Python package's hbmcoll.init() (pymod/join.c):
 *
 * 1. The node's ranks allgather their ranks in the job over shared memory.
 * 2. Local rank 0 of every node opens a bridge endpoint (its pool in the node's arena where it
 *    fits) and meets the others at the rendezvous (nodes_meet.c) as member "its node's lowest
 *    rank", bringing the node's name and ranks with its card. The node holding rank 0 listens.
 *    It checks that the nodes speak the same protocol and size, that their ranks cover
 *    0..size-1 once each, that no two nodes share a name, and that every node opened its
 *    endpoint on an interface the others can reach; otherwise every rank gets that one error.
 *    Nodes are numbered by their lowest rank, so node 0 holds rank 0.
 * 3. Local rank 0 hands the layout (or the error) to the node's other ranks.
 * 4. There is one ring per local rank every node has (the fewest ranks of any node): local rank l
 *    of every node joins ring l at the rendezvous port + l. One word goes around each ring, so an
 *    endpoint the others cannot reach is an error here, not a hang in the first collective.
 * Until step 3 every local rank fails alike; after it a failure is this rank's own, and it aborts
 * the node's communicator so its node's ranks do not wait for it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "nodes.h"

typedef struct {
  uint8_t protocol[4], size[4], nranks[4], failed[4];
  char name[128], addr[48], error[COLL__NODES_TEXT];
  uint8_t cardlen[4], card[COLL_NET_CARD_MAX];
} join_head_t; /* + nranks ranks (4 bytes each), all big-endian */

static void join_put(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t join_get(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The head of a blob, or NULL when it is too short for what it says. */
static const join_head_t *join_head(const coll__nodes_blob_t *b) {
  const join_head_t *h = (const join_head_t *)b->blob;
  if (b->len < sizeof *h || join_get(h->nranks) > (b->len - sizeof *h) / 4) return NULL;
  return h;
}
static int join_rank(const join_head_t *h, uint32_t i) { return (int)join_get((const uint8_t *)(h + 1) + 4 * i); }

static int join_cmp_int(const void *x, const void *y) {
  int a = *(const int *)x, b = *(const int *)y;
  return (a > b) - (a < b);
}

/* "0-2, 5" into out: the ranks of 0..size-1 that are (want 1) or are not (want 0) in seen. */
static void join_spans(const uint8_t *seen, int size, int want, char *out, size_t len) {
  int used = 0;
  out[0] = '\0';
  for (int r = 0; r < size && used >= 0 && (size_t)used < len; r++) {
    if (!!seen[r] != want || (r > 0 && !!seen[r - 1] == want)) continue;
    int e = r;
    while (e + 1 < size && !!seen[e + 1] == want) e++;
    used += e == r ? snprintf(out + used, len - (size_t)used, "%s%d", used ? ", " : "", r)
                   : snprintf(out + used, len - (size_t)used, "%s%d-%d", used ? ", " : "", r, e);
  }
}

static void join_who(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len) {
  int size = *(const int *)arg, used = snprintf(text, len, "nodes");
  uint8_t *seen = calloc((size_t)size, 1);
  for (int i = 0; i < n && used >= 0 && (size_t)used < len; i++) {
    const join_head_t *h = join_head(&blobs[i]);
    if (h == NULL) continue;
    used += snprintf(text + used, len - (size_t)used, "%s %.64s", i ? "," : "", h->name);
    for (uint32_t k = 0; seen && k < join_get(h->nranks); k++)
      if (join_rank(h, k) >= 0 && join_rank(h, k) < size) seen[join_rank(h, k)] = 1;
  }
  char came[96] = "", missing[96] = "";
  if (seen) join_spans(seen, size, 1, came, sizeof came), join_spans(seen, size, 0, missing, sizeof missing);
  if (used >= 0 && (size_t)used < len)
    snprintf(text + used, len - (size_t)used, " came with ranks %s of %d; missing: the nodes of ranks %s", came, size,
             missing);
  free(seen);
}

/* The rendezvous of local ranks 0: 1 when every node came and the layout adds up, 0 while nodes may
 * still come, or COLL_EBOOTSTRAP with the one error of the job. */
static int join_complete(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len) {
  int size = *(const int *)arg, total = 0, twice = 0;
  for (int i = 0; i < n; i++) {
    const join_head_t *h = join_head(&blobs[i]);
    if (h == NULL) return snprintf(text, len, "a node sent a head that does not parse"), COLL_EBOOTSTRAP;
    const join_head_t *me = join_head(&blobs[0]);
    if (join_get(h->protocol) != COLL__NODES_PROTOCOL)
      return snprintf(text, len, "the nodes disagree on the protocol between nodes: node %.64s has %d, %.64s %u; "
                      "launch every node of the job alike (the same hbmcoll)", me->name, COLL__NODES_PROTOCOL,
                      h->name, join_get(h->protocol)), COLL_EBOOTSTRAP;
    if ((int)join_get(h->size) != size)
      return snprintf(text, len, "the nodes disagree on the job's size (ranks in all): node %.64s has %d, %.64s %u; "
                      "launch every node of the job alike (the same --nnodes and ranks per node, the same hbmcoll)",
                      me->name, size, h->name, join_get(h->size)), COLL_EBOOTSTRAP;
    total += (int)join_get(h->nranks);
  }
  uint8_t *seen = calloc((size_t)size, 1);
  int *all = calloc((size_t)total + 1, sizeof *all), k = 0, bad = 0;
  if (!seen || !all) return free(seen), free(all), snprintf(text, len, "out of memory"), -ENOMEM;
  for (int i = 0; i < n; i++) {
    const join_head_t *h = join_head(&blobs[i]);
    for (uint32_t j = 0; j < join_get(h->nranks); j++) {
      int r = join_rank(h, j);
      all[k++] = r;
      if (r < 0 || r >= size || seen[r]) bad = 1;
      else seen[r] = 1;
    }
  }
  int rc = 1;
  if (total < size && !bad) {
    rc = 0;
  } else if (bad || total != size) {
    char held[200] = "";
    int used = 0;
    qsort(all, (size_t)total, sizeof *all, join_cmp_int);
    for (int i = 0; i < total && used >= 0 && (size_t)used < sizeof held; i++)
      used += snprintf(held + used, sizeof held - (size_t)used, "%s%d", i ? ", " : "", all[i]);
    snprintf(text, len, "the nodes' ranks do not make one job of %d: the nodes that came hold [%s]; is every "
             "node's launch for the same job and size?", size, held);
    rc = COLL_EBOOTSTRAP;
  }
  for (int i = 0; i < n && rc == 1; i++) {
    const join_head_t *h = join_head(&blobs[i]);
    for (int j = 0; j < i; j++) twice |= strcmp(join_head(&blobs[j])->name, h->name) == 0;
    if (twice)
      snprintf(text, len, "several nodes call themselves %.64s; give each node its own name with HBMCOLL_NODE (by "
               "default the hostname)", h->name), rc = COLL_EBOOTSTRAP;
    else if (join_get(h->failed))
      snprintf(text, len, "node %.64s could not open its bridge endpoint: %.200s", h->name, h->error), rc = COLL_EBOOTSTRAP;
    else if (n > 1 && (strncmp(h->addr, "127.", 4) == 0 || strcmp(h->addr, "::1") == 0))
      snprintf(text, len, "node %.64s's bridge is on a loopback interface (%s), which the other nodes cannot reach: "
               "set HBMCOLL_IFACE to its interface toward them", h->name, h->addr), rc = COLL_EBOOTSTRAP;
  }
  free(seen), free(all);
  return rc;
}

/* ---- the node's share of the layout ---- */
/* Local rank 0's bytes (msg, *len_p) on every local rank (*msg_p malloc'd there). */
static int join_share(coll_comm_t *node, uint8_t **msg_p, size_t *len_p) {
  uint64_t len = coll_comm_rank(node) == 0 ? *len_p : 0;
  coll_args_t a = {.kind = COLL_BCAST, .dtype = COLL_UINT8, .count = 8, .recv = &len};
  int rc = coll_run(node, &a);
  if (rc) return rc;
  if (coll_comm_rank(node) != 0 && (*msg_p = malloc(len + 1)) == NULL) return -ENOMEM;
  a.count = len, a.recv = *msg_p;
  if ((rc = coll_run(node, &a)) != 0) return rc;
  *len_p = len;
  return 0;
}

typedef struct {
  int nodes, node, rings;
  int *node_of, *local_of;
  char names[256];
} join_layout_t;

/* The message local rank 0 shares: 0, nodes, then per node its count and ranks; the names. */
static uint8_t *join_layout_msg(const coll__nodes_blob_t *blobs, int n, size_t *len_p) {
  size_t len = 8 + 1, at = 8;
  for (int i = 0; i < n; i++) len += 4 + 4 * (size_t)join_get(join_head(&blobs[i])->nranks) + 130;
  uint8_t *m = calloc(1, len);
  if (m == NULL) return NULL;
  join_put(m, 0), join_put(m + 4, (uint32_t)n);
  for (int i = 0; i < n; i++) {
    const join_head_t *h = join_head(&blobs[i]);
    memcpy(m + at, h->nranks, 4), memcpy(m + at + 4, h + 1, 4 * (size_t)join_get(h->nranks));
    at += 4 + 4 * (size_t)join_get(h->nranks);
  }
  for (int i = 0; i < n; i++) at += (size_t)snprintf((char *)m + at, 130, "%s%.64s", i ? ", " : "", join_head(&blobs[i])->name);
  *len_p = at + 1;
  return m;
}

static int join_layout_read(const uint8_t *m, size_t len, int size, int rank, join_layout_t *lay) {
  lay->nodes = (int)join_get(m + 4);
  lay->node_of = malloc((size_t)size * sizeof(int)), lay->local_of = malloc((size_t)size * sizeof(int));
  if (!lay->node_of || !lay->local_of) return -ENOMEM;
  size_t at = 8;
  lay->rings = size, lay->node = -1;
  for (int i = 0; i < lay->nodes; i++) {
    int count = (int)join_get(m + at);
    lay->rings = count < lay->rings ? count : lay->rings;
    for (int l = 0; l < count; l++) {
      int r = (int)join_get(m + at + 4 + 4 * (size_t)l);
      lay->node_of[r] = i, lay->local_of[r] = l;
      if (r == rank) lay->node = i;
    }
    at += 4 + 4 * (size_t)count;
  }
  snprintf(lay->names, sizeof lay->names, "%.*s", (int)(len - at), (const char *)m + at);
  return lay->node < 0 ? COLL_EBOOTSTRAP : 0;
}

/* ---- the rings ---- */
int coll__nodes_ring(coll__net_t *net, int n, int me, coll__nodes_blob_t *cards, coll__net_ring_t **ring_p,
                     char *err, size_t errlen) {
  int *peer = malloc((size_t)n * sizeof *peer), rc = peer ? 0 : -ENOMEM;
  for (int m = 0; m < n && peer; m++) peer[m] = -1;
  int left = (me + n - 1) % n, right = (me + 1) % n;
  if (rc == 0) rc = coll__net_add_peer(net, cards[left].blob, cards[left].len, &peer[left], err, errlen);
  if (rc == 0 && right != left) rc = coll__net_add_peer(net, cards[right].blob, cards[right].len, &peer[right], err, errlen);
  if (rc == 0) rc = coll__net_ring_make(net, n, me, peer[left], peer[right], ring_p);
  for (int m = 0; m < n && rc == 0; m++) { /* every member: the small allgather writes 2^k away */
    if (m == me) continue;
    if (peer[m] < 0) rc = coll__net_add_peer(net, cards[m].blob, cards[m].len, &peer[m], err, errlen);
    if (rc == 0) rc = coll__net_ring_reach(*ring_p, m, peer[m]);
  }
  free(peer);
  return rc;
}

int coll__nodes_open(coll_comm_t *node, const char *iface, int family, size_t pool_bytes, coll__net_t **net_p,
                     char *err, size_t errlen) {
  size_t bytes = pool_bytes ? pool_bytes : COLL__NODES_POOL;
  void *pool = NULL;
  if (coll_arena_alloc(node, bytes, 4096, &pool) != 0) pool = NULL; /* no room: a pool of its own */
  int rc = coll__net_open_on(iface, family, pool, bytes, net_p, err, errlen);
  if (rc && pool) coll_arena_free(node, pool);
  return rc;
}

static int join_port(const coll__nodes_join_t *cfg, int ring) {
  return cfg->ports && ring < cfg->nports ? cfg->ports[ring] : cfg->port + ring;
}

int coll__nodes_join(coll_comm_t *node, const coll__nodes_join_t *cfg, coll_comm_t **comm_p, char *err,
                     size_t errlen) {
  int L = coll_comm_size(node), l = coll_comm_rank(node), size = cfg->size, rc;
  int32_t *ranks = calloc((size_t)L, sizeof *ranks), me32 = cfg->rank;
  uint8_t *msg = NULL;
  size_t msg_len = 0;
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  coll__nodes_watch_t *watch = NULL;
  coll__nodes_blob_t *blobs = NULL;
  int nblobs = 0;
  join_layout_t lay = {0};
  coll__nodes_meet_t how = {.who = join_who, .complete = join_complete, .arg = &size, .warn = node->warn_fn,
                            .warn_arg = node->warn_arg, .interrupt = node->interrupt_fn,
                            .interrupt_arg = node->interrupt_arg, .listener = l == 0 ? cfg->listener : 0};
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 1, .send = &me32, .recv = ranks};
  if (strlen(cfg->secret) < COLL__NODES_KEY_MIN) { /* every rank says so at once, alike */
    free(ranks);
    if (cfg->node_back) *cfg->node_back = node; /* every local rank fails alike: none waits */
    else coll_comm_free(node);
    snprintf(err, errlen, "the job's secret (HBMCOLL_JOB_KEY) has %zu characters: across nodes it needs %d or more, "
             "random and the same on every node (e.g. `openssl rand -hex 16`)", strlen(cfg->secret), COLL__NODES_KEY_MIN);
    return COLL_EBADARG;
  }
  if (ranks == NULL) rc = -ENOMEM, snprintf(err, errlen, "out of memory");
  else if ((rc = coll_run(node, &a)) != 0) snprintf(err, errlen, "the node's ranks could not swap their ranks: %s",
                                                    coll_strerror(rc));
  if (rc) goto fail_alone;
  if (l == 0) { /* step 2: meet the other nodes */
    int low = ranks[0];
    for (int i = 1; i < L; i++) low = ranks[i] < low ? ranks[i] : low;
    size_t hlen = sizeof(join_head_t) + 4 * (size_t)L;
    join_head_t *h = calloc(1, hlen);
    if (h == NULL) rc = -ENOMEM, snprintf(err, errlen, "out of memory");
    if (h) {
      join_put(h->protocol, COLL__NODES_PROTOCOL), join_put(h->size, (uint32_t)size), join_put(h->nranks, (uint32_t)L);
      snprintf(h->name, sizeof h->name, "%s", cfg->name);
      for (int i = 0; i < L; i++) join_put((uint8_t *)(h + 1) + 4 * i, (uint32_t)ranks[i]);
      char why[COLL__NODES_TEXT] = "";
      if (coll__nodes_open(node, cfg->iface, cfg->family, cfg->pool_bytes, &net, why, sizeof why) != 0) {
        join_put(h->failed, 1); /* the other nodes learn it at the rendezvous instead of waiting */
        snprintf(h->error, sizeof h->error, "%s", why);
      } else {
        join_put(h->cardlen, (uint32_t)coll__net_card(net, h->card));
        coll__iface_address(cfg->iface, cfg->family, h->addr, sizeof h->addr);
      }
      /* the node's other ranks wait for this one, bounded by the same time: end a little sooner */
      double first = cfg->timeout_s > 8 ? cfg->timeout_s - 2 : cfg->timeout_s * 3 / 4;
      rc = coll__nodes_meet(low == 0 ? 0 : low, cfg->addr, join_port(cfg, 0), cfg->secret, (const uint8_t *)h, hlen, &how,
                            first, &blobs, &nblobs, &watch, err, errlen);
      free(h);
    }
    if (rc == 0 && (msg = join_layout_msg(blobs, nblobs, &msg_len)) == NULL) rc = -ENOMEM;
    if (rc) {
      size_t tl = strlen(err);
      msg = malloc(8 + tl + 1), msg_len = 8 + tl + 1;
      if (msg) join_put(msg, (uint32_t)-rc), memcpy(msg + 8, err, tl + 1);
    }
  }
  int shared = msg != NULL || l != 0 ? join_share(node, &msg, &msg_len) : -ENOMEM;
  if (shared) {
    if (rc == 0) rc = shared, snprintf(err, errlen, "the layout could not reach the node's ranks: %s", coll_strerror(shared));
    goto fail_alone;
  }
  if (join_get(msg) != 0) { /* local rank 0 failed: every local rank says why */
    rc = -(int)join_get(msg);
    if (l != 0) snprintf(err, errlen, "local rank 0 of this node failed to meet the other nodes: %s", (char *)msg + 8);
    if (cfg->node_back) { /* every local rank has it, and none waits: the node's communicator goes back */
      uint8_t *pool = net ? coll__net_pool(net) : NULL;
      coll__net_close(net), net = NULL;
      coll_arena_free(node, pool); /* local rank 0's pool, when the arena held it (else ignored) */
      *cfg->node_back = node, node = NULL;
    }
    goto fail_alone;
  }
  if ((rc = join_layout_read(msg, msg_len, size, cfg->rank, &lay)) != 0) {
    snprintf(err, errlen, "the layout local rank 0 shared does not hold rank %d", cfg->rank);
    goto fail;
  }
  coll__nodes_blob_t *cards = NULL;
  int ncards = 0;
  if (l == 0) { /* ring 0's cards came with the heads */
    cards = calloc((size_t)nblobs, sizeof *cards);
    for (int i = 0; cards && i < nblobs; i++) {
      const join_head_t *h = join_head(&blobs[i]);
      cards[i] = (coll__nodes_blob_t){.blob = (uint8_t *)h->card, .len = join_get(h->cardlen)};
    }
    ncards = nblobs;
    if (cards == NULL) rc = -ENOMEM;
  } else if (l < lay.rings) { /* step 4: ring l's own rendezvous */
    coll__nodes_meet_t ring_how = how;
    ring_how.complete = coll__nodes_members_complete, ring_how.who = coll__nodes_members_who;
    ring_how.arg = &lay.nodes, ring_how.listener = cfg->listener;
    rc = coll__nodes_open(node, cfg->iface, cfg->family, cfg->pool_bytes, &net, err, errlen);
    uint8_t card[COLL_NET_CARD_MAX];
    if (rc == 0 && cfg->ports && l >= cfg->nports)
      rc = COLL_EBOOTSTRAP, snprintf(err, errlen, "ring %d has no rendezvous port (%d given)", l, cfg->nports);
    if (rc == 0)
      rc = coll__nodes_meet(lay.node, cfg->addr, join_port(cfg, l), cfg->secret, card, coll__net_card(net, card),
                            &ring_how, cfg->timeout_s, &blobs, &nblobs, &watch, err, errlen);
    cards = blobs, ncards = nblobs, blobs = NULL, nblobs = 0;
  }
  if (rc == 0 && net && lay.nodes > 1) {
    if (ncards != lay.nodes) rc = COLL_EBOOTSTRAP, snprintf(err, errlen, "ring %d has %d members for %d nodes", l, ncards, lay.nodes);
    else rc = coll__nodes_ring(net, lay.nodes, lay.node, cards, &ring, err, errlen);
    if (rc == 0) {
      coll__net_watch(net, coll__nodes_watch_fd(watch), "the job's other nodes");
      int32_t word = 0;
      double probe = cfg->timeout_s > 0 && cfg->timeout_s < 60 ? cfg->timeout_s : 60;
      char why[COLL__NODES_TEXT];
      rc = coll__net_ring_allreduce(ring, COLL_INT32, COLL_SUM, &word, 1, probe, why, sizeof why);
      if (rc == -ETIMEDOUT)
        snprintf(err, errlen, "the bridge's ring could not pass one word around the nodes in %.0f s: a node's endpoint "
                 "is unreachable from its neighbour (check HBMCOLL_IFACE on every node, and that %s reach each other)",
                 probe, lay.names), rc = COLL_EBOOTSTRAP;
      else if (rc)
        snprintf(err, errlen, "ring %d's first word around the nodes: %s", l, why);
    }
  }
  if (l == 0) free(cards);
  else coll__nodes_blobs_free(cards, ncards);
  if (rc) goto fail;
  coll__span_config_t span = {.local = node, .net = net, .ring = ring, .watch = watch, .nodes = lay.nodes,
                              .node = lay.node, .rings = lay.rings, .size = size, .node_of = lay.node_of,
                              .local_of = lay.local_of, .timeout_s = cfg->wait_s, .iface = cfg->iface,
                              .family = cfg->family, .pool_bytes = cfg->pool_bytes};
  rc = coll__comm_span(&span, comm_p, err, errlen); /* takes the parts, also on failure */
  coll__nodes_blobs_free(blobs, nblobs);
  free(lay.node_of), free(lay.local_of), free(msg), free(ranks);
  return rc;
fail:
  coll_comm_abort(node, rc == COLL_EPEERLOST ? COLL_EPEERLOST : COLL_EABORTED); /* its ranks may wait for this one */
fail_alone:
  coll__nodes_watch_abort(watch);
  coll__net_ring_free(ring);
  coll__net_close(net);
  coll_comm_free(node);
  coll__nodes_blobs_free(blobs, nblobs);
  free(lay.node_of), free(lay.local_of), free(msg), free(ranks);
  return rc;
}
