/*
 * nodes_split.c - coll_comm_split of a communicator that spans nodes (nodes_comm.c):
 *
 * 1. Every rank's color, key and node are allgathered over the parent. The ranks of a color,
 *    ordered by (key, rank), are the new communicator; its nodes are numbered in the order their
 *    first rank comes, so its node 0 holds its rank 0.
 * 2. The node's communicator is split with the same colors and the new ranks as keys: the new
 *    node communicator, its ranks in the new order, as the layer (hier.h) wants them.
 * 3. A group on one node is that node communicator and nothing more. A group across nodes has one
 *    ring per local rank every one of its nodes has (the fewest); their carriers open endpoints,
 *    and every rank's card (or why it has none) is allgathered over the parent: no rendezvous,
 *    port or secret, since the parent's channels are the job's already. Whether any group spans
 *    more than one node, every rank reads from the same triples of step 1: if one does, every rank
 *    takes part (those in a group on one node, or in none, with no card), so the collective
 *    matches; if none does, no rank does, and the split costs the parent one allgather, not two.
 *    A rank that fails before step 3 ends the parent (step 4): where the cards are allgathered,
 *    every other rank's split fails there too; where they are not, another rank's split (on
 *    another node) may succeed, and its parent's next call fails.
 * 4. The new communicator watches the parent's connection (a duplicate of its fd): a failure of
 *    either ends both, as any failed call ends the job's communicator. So does a failure here, on
 *    every rank, with the sentence of the rank that failed.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coll_internal.h"
#include "nodes.h"

typedef struct {
  int32_t color, key, node;
} split_member_t;

typedef struct {
  int32_t rc; /* 0, or why this carrier has no endpoint (the text in error) */
  uint32_t len;
  uint8_t card[COLL_NET_CARD_MAX];
  char error[256];
} split_card_t;
_Static_assert(sizeof(split_card_t) % 4 == 0, "cards travel as int32");

typedef struct {
  int n, me;               /* the group's size and my rank in it (-1: in none) */
  int *order;              /* [n]: the parent's rank of each new rank */
  int *node_of, *local_of; /* [n] */
  int nodes, rings;
} split_group_t;

static void split_group_free(split_group_t *g) { free(g->order), free(g->node_of), free(g->local_of); }

/* The group of my color from every rank's (color, key, node). 0 or -ENOMEM. */
static int split_group(const split_member_t *all, int size, int rank, split_group_t *g) {
  int color = all[rank].color;
  *g = (split_group_t){.me = -1};
  g->order = malloc((size_t)size * sizeof *g->order);
  g->node_of = malloc((size_t)size * sizeof *g->node_of);
  g->local_of = malloc((size_t)size * sizeof *g->local_of);
  int *seen = malloc((size_t)size * sizeof *seen), *count = calloc((size_t)size, sizeof *count);
  if (!g->order || !g->node_of || !g->local_of || !seen || !count) {
    free(seen), free(count);
    return -ENOMEM;
  }
  for (int r = 0; r < size && color >= 0; r++) { /* insertion by (key, rank): ranks come in order */
    if (all[r].color != color) continue;
    int i = g->n++;
    while (i > 0 && all[g->order[i - 1]].key > all[r].key) g->order[i] = g->order[i - 1], i--;
    g->order[i] = r;
  }
  for (int i = 0; i < g->n; i++) {
    int parent_node = all[g->order[i]].node, m = 0;
    while (m < g->nodes && seen[m] != parent_node) m++;
    if (m == g->nodes) seen[g->nodes++] = parent_node;
    g->node_of[i] = m, g->local_of[i] = count[m]++;
    if (g->order[i] == rank) g->me = i;
  }
  g->rings = g->n;
  for (int m = 0; m < g->nodes; m++) g->rings = count[m] < g->rings ? count[m] : g->rings;
  free(seen), free(count);
  return 0;
}

/* Whether some group has ranks on two nodes: every rank's answer, from the same triples. A group's
 * first rank stands for its node; a rank elsewhere makes it span. */
static int split_spans(const split_member_t *all, int size) {
  for (int r = 0; r < size; r++) {
    if (all[r].color < 0) continue; /* in no group */
    int first = 0;
    while (all[first].color != all[r].color) first++; /* ends at r at the latest */
    if (all[first].node != all[r].node) return 1;
  }
  return 0;
}

/* Steps 3 and 4 for a group across nodes: the carriers' endpoints, the cards, the ring, the
 * communicator (which takes local). 0 and *comm_p, or a failure with a sentence in err. */
static int split_span(coll_comm_t *c, const split_group_t *g, coll_comm_t *local, coll_comm_t **comm_p, char *err,
                      size_t errlen) {
  split_card_t mine = {0}, *cards = calloc((size_t)c->size, sizeof *cards);
  coll__net_t *net = NULL;
  coll__net_ring_t *ring = NULL;
  int l = g->me >= 0 ? g->local_of[g->me] : -1, rc = cards ? 0 : -ENOMEM;
  if (rc == 0 && g->nodes > 1 && l >= 0 && l < g->rings) {
    mine.rc = coll__nodes_open(local, coll__span_iface(c), coll__span_family(c), coll__span_pool_bytes(c), &net,
                               mine.error, sizeof mine.error);
    if (mine.rc == 0) mine.len = (uint32_t)coll__net_card(net, mine.card);
  }
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = sizeof mine / 4, .send = &mine, .recv = cards};
  if (rc == 0 && (rc = coll_run(c, &a)) != 0) snprintf(err, errlen, "the split's cards: %s", coll_strerror(rc));
  for (int i = 0; i < g->n && rc == 0 && g->nodes > 1; i++) {
    const split_card_t *k = &cards[g->order[i]];
    if (k->rc) rc = k->rc, snprintf(err, errlen, "rank %d could not open its bridge endpoint for a split: %.*s",
                                    g->order[i], (int)sizeof k->error, k->error);
  }
  if (g->nodes <= 1) { /* a group on one node, or none: the cards were for the other groups */
    free(cards);
    return rc;
  }
  if (rc == 0 && net) {
    coll__nodes_blob_t *ring_cards = calloc((size_t)g->nodes, sizeof *ring_cards);
    for (int i = 0; i < g->n && ring_cards; i++)
      if (g->local_of[i] == l) {
        split_card_t *k = &cards[g->order[i]];
        ring_cards[g->node_of[i]] = (coll__nodes_blob_t){.member = g->node_of[i], .blob = k->card, .len = k->len};
      }
    rc = ring_cards ? coll__nodes_ring(net, g->nodes, g->node_of[g->me], ring_cards, &ring, err, errlen) : -ENOMEM;
    free(ring_cards);
  }
  free(cards);
  if (rc) {
    coll__net_ring_free(ring);
    coll__net_close(net);
    coll_comm_free(local);
    return rc;
  }
  coll__span_config_t cfg = {.local = local, .net = net, .ring = ring, .nodes = g->nodes, .node = g->node_of[g->me],
                             .rings = g->rings, .size = g->n, .node_of = g->node_of, .local_of = g->local_of,
                             .timeout_s = coll__span_timeout(c), .iface = coll__span_iface(c),
                             .family = coll__span_family(c), .pool_bytes = coll__span_pool_bytes(c), .parent = c};
  return coll__comm_span(&cfg, comm_p, err, errlen); /* takes the parts, also on failure */
}

int coll__span_split(coll_comm_t *c, int color, int key, coll_comm_t **comm_p) {
  split_member_t mine = {color < 0 ? -1 : color, key, coll__span_node_index(c)};
  split_member_t *all = calloc((size_t)c->size, sizeof *all);
  split_group_t g = {.me = -1};
  char err[COLL__NODES_TEXT] = "";
  if (all == NULL) return -ENOMEM;
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 3, .send = &mine, .recv = all};
  int rc = coll_run(c, &a); /* a failure here ended c already, on every rank */
  if (rc) {
    free(all);
    return rc;
  }
  coll_comm_t *made = NULL, *local = NULL;
  if ((rc = split_group(all, c->size, c->rank, &g)) != 0) snprintf(err, sizeof err, "out of memory in a split");
  if (rc == 0 && (rc = coll_comm_split(coll__comm_here(c), mine.color, g.me, &local)) != 0) {
    const char *why = NULL;
    coll_comm_error(coll__comm_here(c), &why);
    snprintf(err, sizeof err, "the node's part of a split: %s", why && *why ? why : coll_strerror(rc));
  }
  if (rc == 0 && !split_spans(all, c->size)) { /* every group on one node: no rank swaps cards */
    made = local;
  } else if (rc == 0 && g.nodes <= 1) { /* on one node (or in none), another group spans: all swap cards */
    split_group_t none = {.me = -1};
    rc = split_span(c, &none, NULL, &made, err, sizeof err);
    if (rc == 0) made = local;
    else coll_comm_free(local);
  } else if (rc == 0) {
    rc = split_span(c, &g, local, &made, err, sizeof err);
  }
  if (rc) {
    char text[COLL__NODES_TEXT + 64];
    snprintf(text, sizeof text, "rank %d failed in a split: %s", c->rank, err);
    coll__span_fail(c, rc, text); /* every rank: none waits for this one's part */
  } else {
    *comm_p = made; /* untouched on failure, as coll.h says */
  }
  split_group_free(&g);
  free(all);
  return rc;
}
