/*
 * p2p_match.c - point-to-point matching and progress: which receive a message goes to.
 *
 * A rank keeps, in its own memory, the receives posted and not yet matched (in post order)
 * and the messages that came before any receive matched them (the unexpected list, in arrival
 * order). Progress reads every incoming channel in cell order and gives each new message to
 * the first posted receive whose source and tag match, else appends it to the unexpected
 * list; a new receive first takes the first unexpected message it matches, else it is posted.
 * Since each channel is read in order, and a receive looks at the unexpected list (older)
 * before the channels (newer), a receive always gets the first matching message a sender
 * sent it: MPI's non-overtaking rule.
 *
 * An unexpected eager message is copied out of its cell (so the cell frees at once and the
 * sender is never held up by a receive posted late); an unexpected rendezvous keeps only the
 * address, and is pulled when a receive takes it, or earlier by a rank that has been waiting
 * a while (progress with `deep`): a rank blocked in its own large send must still let its
 * peer's large send finish, or two ranks that both send before they receive would wait for
 * each other for ever (the socket path buffered everything too). A long message in pieces
 * with no receive yet goes into a malloc'd buffer of its full length as the pieces come.
 *
 * A message longer than its receive's buffer fills the buffer, the rest is dropped, and that
 * receive alone completes with COLL_EMISMATCH (its status carries the whole length).
 *
 * Everything here runs with the state's lock held (p2p.c).
 */
#include <stdlib.h>
#include <string.h>

#include "p2p.h"

void coll__p2p_list_push(coll__p2p_list_t *l, coll__p2p_op_t *op) {
  op->next = NULL;
  op->prev = l->tail;
  if (l->tail) l->tail->next = op;
  else l->head = op;
  l->tail = op;
}

void coll__p2p_list_remove(coll__p2p_list_t *l, coll__p2p_op_t *op) {
  if (op->prev) op->prev->next = op->next;
  else l->head = op->next;
  if (op->next) op->next->prev = op->prev;
  else l->tail = op->prev;
  op->prev = op->next = NULL;
}

void coll__p2p_finish(coll__p2p_t *p, coll__p2p_op_t *op, int result) {
  op->result = result;
  op->stage = OP_DONE;
  if (op->request) { /* off the list of unfinished requests */
    if (op->lprev) op->lprev->lnext = op->lnext;
    else if (p->live == op) p->live = op->lnext;
    if (op->lnext) op->lnext->lprev = op->lprev;
    op->lprev = op->lnext = NULL;
  }
}

static int match_fits(const coll__p2p_op_t *op, int source, int tag) {
  return (op->peer == COLL_ANY_SOURCE || op->peer == source) && (op->tag == COLL_ANY_TAG || op->tag == tag);
}

static coll__p2p_op_t *match_posted(coll__p2p_t *p, int source, int tag) {
  for (coll__p2p_op_t *op = p->posted.head; op; op = op->next)
    if (match_fits(op, source, tag)) return op;
  return NULL;
}

/* The receive got a message of `bytes` from source/tag; `copied` of them are in its buffer. */
static void match_complete(coll__p2p_t *p, coll__p2p_op_t *op, int source, int tag, size_t bytes, int rc) {
  op->status.source = source;
  op->status.tag = tag;
  op->status.bytes = bytes;
  coll__p2p_finish(p, op, rc ? rc : bytes > op->bytes ? COLL_EMISMATCH : 0);
}

static size_t match_min(size_t a, size_t b) { return a < b ? a : b; }

/* Pull rendezvous n of `source` into dst (at most cap bytes): 1 done (*rc_p its result), 0 the
 * sender revoked it (the message never existed). */
static int match_pull(coll__p2p_t *p, int source, uint64_t n, uint64_t addr, void *dst, size_t cap,
                      int *rc_p) {
  coll__p2p_chan_t *ch = coll__p2p_chan(p, source, p->rank);
  _Atomic uint64_t *w = &ch->rdv[n % COLL_P2P_RDV];
  uint64_t expect = n << 2 | RDV_POSTED;
  if (!atomic_compare_exchange_strong(w, &expect, n << 2 | RDV_PULLING)) return 0;
  *rc_p = coll__p2p_copy_in(p, source, n, dst, addr, cap);
  atomic_store_explicit(w, n << 2 | RDV_DONE, memory_order_release);
  coll__p2p_ring(p, source);
  return 1;
}

static void unx_append(coll__p2p_t *p, coll__p2p_msg_t *m) {
  m->next = NULL;
  m->prev = p->unx_tail;
  if (p->unx_tail) p->unx_tail->next = m;
  else p->unx_head = m;
  p->unx_tail = m;
}

static void unx_drop(coll__p2p_t *p, coll__p2p_msg_t *m) {
  if (m->prev) m->prev->next = m->next;
  else p->unx_head = m->next;
  if (m->next) m->next->prev = m->prev;
  else p->unx_tail = m->prev;
  free(m->data);
  free(m);
}

/* A piece of the long message `source` is sending. */
static void match_piece(coll__p2p_t *p, int source, const uint8_t *data, size_t len) {
  coll__p2p_cur_t *cur = &p->cur[source];
  if (cur->op && cur->got < cur->op->bytes)
    memcpy(cur->op->buf + cur->got, data, match_min(len, cur->op->bytes - cur->got));
  else if (cur->msg)
    memcpy(cur->msg->data + cur->got, data, len);
  cur->got += len;
  if (cur->msg) cur->msg->got = cur->got;
  if (cur->got < cur->bytes) return;
  if (cur->op) match_complete(p, cur->op, source, cur->tag, cur->bytes, 0);
  cur->active = 0;
  cur->op = NULL;
  cur->msg = NULL;
}

/* One cell from `source`. Returns 0, or -1 when it cannot be taken now (no memory for an
 * unexpected copy: it stays in the channel until a later try). */
static int match_cell(coll__p2p_t *p, int source, coll__p2p_cell_t *cell) {
  coll__p2p_cur_t *cur = &p->cur[source];
  if (cur->active) { /* P2P_CHUNK */
    match_piece(p, source, coll__p2p_payload(cell), cell->len);
    return 0;
  }
  coll__p2p_op_t *op = match_posted(p, source, cell->tag);
  if (cell->kind == P2P_RTS && op) { /* revoked by its sender: the receive stays where it is */
    int rc = 0;
    if (match_pull(p, source, cell->rdv, cell->addr, op->buf, match_min(cell->bytes, op->bytes), &rc)) {
      coll__p2p_list_remove(&p->posted, op);
      match_complete(p, op, source, cell->tag, cell->bytes, rc);
    }
    return 0;
  }
  if (op && cell->kind == P2P_EAGER) {
    coll__p2p_list_remove(&p->posted, op);
    if (cell->len) memcpy(op->buf, coll__p2p_payload(cell), match_min(cell->len, op->bytes));
    match_complete(p, op, source, cell->tag, cell->bytes, 0);
    return 0;
  }
  if (op) { /* P2P_LONG into the receive */
    coll__p2p_list_remove(&p->posted, op);
    op->stage = OP_TAKING;
    op->status.source = source;
    *cur = (coll__p2p_cur_t){.active = 1, .op = op, .bytes = cell->bytes, .tag = cell->tag};
    match_piece(p, source, coll__p2p_payload(cell), cell->len);
    return 0;
  }
  coll__p2p_msg_t *m = calloc(1, sizeof *m);
  if (m == NULL) return -1;
  *m = (coll__p2p_msg_t){.source = source, .tag = cell->tag, .kind = cell->kind, .bytes = cell->bytes,
                         .addr = cell->addr, .rdv = cell->rdv};
  if (cell->kind != P2P_RTS && cell->bytes && (m->data = malloc(cell->bytes)) == NULL) {
    free(m);
    return -1;
  }
  unx_append(p, m);
  if (cell->kind == P2P_EAGER) {
    if (cell->len) memcpy(m->data, coll__p2p_payload(cell), cell->len);
    m->got = cell->len;
  } else if (cell->kind == P2P_LONG) {
    *cur = (coll__p2p_cur_t){.active = 1, .msg = m, .bytes = cell->bytes, .tag = cell->tag};
    match_piece(p, source, coll__p2p_payload(cell), cell->len);
  }
  return 0;
}

static void match_channel(coll__p2p_t *p, int source) {
  coll__p2p_chan_t *ch = coll__p2p_chan(p, source, p->rank);
  uint64_t n = p->taken[source];
  uint64_t head = atomic_load_explicit(&ch->head, memory_order_acquire);
  if (n == head) return;
  while (n < head && match_cell(p, source, coll__p2p_cell(p, ch, n)) == 0) n++;
  if (n == p->taken[source]) return;
  p->taken[source] = n;
  atomic_store_explicit(&ch->tail, n, memory_order_release);
  coll__p2p_ring(p, source);
}

/* Unexpected rendezvous messages into buffers of their own: their senders may go on. */
static void match_pull_unexpected(coll__p2p_t *p) {
  for (coll__p2p_msg_t *m = p->unx_head, *next; m; m = next) {
    next = m->next;
    if (m->kind != P2P_RTS || m->data) continue;
    if ((m->data = malloc(m->bytes)) == NULL) return;
    int rc = 0;
    if (!match_pull(p, m->source, m->rdv, m->addr, m->data, m->bytes, &rc) || rc) unx_drop(p, m);
    else m->got = m->bytes;
  }
}

void coll__p2p_progress(coll__p2p_t *p, int deep) {
  for (int d = 0; d < p->size; d++)
    if (p->outq[d].head) coll__p2p_push(p, d);
  for (coll__p2p_op_t *op = p->pulls.head, *next; op; op = next) {
    next = op->next;
    coll__p2p_copy_help(p, op);
    coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, op->peer);
    if (atomic_load_explicit(&ch->rdv[op->rdv % COLL_P2P_RDV], memory_order_acquire) ==
        (op->rdv << 2 | RDV_DONE)) {
      coll__p2p_list_remove(&p->pulls, op);
      coll__p2p_finish(p, op, 0);
    }
  }
  for (int s = 0; s < p->size; s++) match_channel(p, s);
  if (deep) match_pull_unexpected(p);
}

int coll__p2p_pending(const coll__p2p_t *p) {
  if (p->posted.head) return 1;
  for (int r = 0; r < p->size; r++)
    if (p->outq[r].head || p->cur[r].active) return 1;
  return 0;
}

void coll__p2p_post_recv(coll__p2p_t *p, coll__p2p_op_t *op) {
  for (coll__p2p_msg_t *m = p->unx_head, *next; m; m = next) {
    next = m->next;
    if (!match_fits(op, m->source, m->tag)) continue;
    if (m->kind == P2P_RTS && m->data == NULL) { /* still in the sender */
      int rc = 0;
      if (!match_pull(p, m->source, m->rdv, m->addr, op->buf, match_min(m->bytes, op->bytes), &rc)) {
        unx_drop(p, m); /* revoked: it never was */
        continue;
      }
      match_complete(p, op, m->source, m->tag, m->bytes, rc);
    } else if (m->kind == P2P_LONG && m->got < m->bytes) { /* pieces still coming: take them over */
      coll__p2p_cur_t *cur = &p->cur[m->source];
      if (m->got) memcpy(op->buf, m->data, match_min(m->got, op->bytes));
      cur->op = op;
      cur->msg = NULL;
      op->stage = OP_TAKING;
      op->status.source = m->source;
    } else {
      if (m->bytes) memcpy(op->buf, m->data, match_min(m->bytes, op->bytes));
      match_complete(p, op, m->source, m->tag, m->bytes, 0);
    }
    unx_drop(p, m);
    return;
  }
  op->stage = OP_POSTED;
  coll__p2p_list_push(&p->posted, op);
}

int coll__p2p_withdraw(coll__p2p_t *p, coll__p2p_op_t *op) {
  switch (op->stage) {
  case OP_QUEUED:
    coll__p2p_list_remove(&p->outq[op->peer], op);
    op->stage = OP_DONE;
    return op->off == 0; /* 0: its first pieces are in the channel already */
  case OP_PULL_WAIT: {
    coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, op->peer);
    _Atomic uint64_t *w = &ch->rdv[op->rdv % COLL_P2P_RDV];
    uint64_t expect = op->rdv << 2 | RDV_POSTED;
    if (atomic_compare_exchange_strong(w, &expect, op->rdv << 2 | RDV_REVOKED)) {
      coll__p2p_list_remove(&p->pulls, op);
      op->stage = OP_DONE;
      return 1;
    }
    return 2; /* being pulled (or pulled): the caller waits the copy out */
  }
  case OP_POSTED:
    coll__p2p_list_remove(&p->posted, op);
    op->stage = OP_DONE;
    return 1;
  case OP_TAKING: /* the rest of its pieces go nowhere */
    p->cur[op->status.source].op = NULL;
    op->stage = OP_DONE;
    return 1;
  default:
    return 1;
  }
}
