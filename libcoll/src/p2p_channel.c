/*
 * p2p_channel.c - point-to-point between the ranks of one node: the channels in the shared
 * segment, and how a message goes into one.
 *
 * What it must do. send/recv/isend/irecv as MPI has them, between two ranks of a communicator,
 * at a cost near MPICH's on a node (0.6 us one way at 8 B), where the Python package used a
 * Unix socket per pair (45-55 us). A pair's messages must never wait for a third rank, must
 * not touch the collectives' rounds and slots, and the irecv-send-wait pattern must finish at
 * any size. Messages from one rank to another match in the order they were sent.
 *
 * Channels. Every ordered pair (s, d) has a channel of its own at the end of the segment, after
 * the arena: a head counter only s writes, a tail counter only d writes, both of which only
 * grow (so nothing is ever cleared and there is no ABA), 64 rendezvous words, then a ring of
 * HBMCOLL_P2P_CELLS cells of 4 KiB (default 8). Cell n of the channel is cells[n % cells]; s
 * may fill cell n while n - tail < cells, and publishes it by storing head = n + 1 (release);
 * d reads cells below head (acquire) and stores tail when it is done with them. One writer per
 * word, one cache line per word: the sender and the receiver never write the same line, so a
 * message costs the receiver one miss on the head line and one on the cell.
 *
 * Three ways a message goes, by size:
 *  - eager, up to 4032 bytes (COLL_P2P_EAGER_MAX): header and bytes in one cell. The send is
 *    complete when the cell is published; the receiver copies out of the cell (into the
 *    receive's buffer, or into a malloc'd copy when no receive matches yet, the "unexpected"
 *    list) and frees it.
 *  - rendezvous, above that, when the receiver can read the sender's memory
 *    (process_vm_readv: same PID namespace, no Yama or seccomp refusal; every rank tries
 *    every peer once at creation and publishes its verdict in its control line, p2p_cma): the
 *    cell carries only the buffer's address, and a rendezvous number n whose word
 *    rdv[n % 64] the sender set to (n, POSTED). The receiver that matches it moves the word to
 *    PULLING by compare-and-swap, reads the whole message straight into the receive's buffer
 *    with process_vm_readv (a copy with itself: memcpy; from 256 KiB the waiting sender
 *    writes part of it meanwhile, p2p_copy.c), sets DONE and rings the sender.
 *    One copy, and the sender need not run while it happens: a rank blocked in a collective
 *    still has its isend pulled. A sender that gives up (timeout, Ctrl-C) swaps POSTED for
 *    REVOKED: the receiver then finds the swap failed and treats the message as never sent;
 *    if the receiver swapped first, the sender waits the copy out. A sender reuses a word
 *    only after DONE or REVOKED, so at most 64 rendezvous per pair are in flight (more wait
 *    in this rank's queue).
 *  - pieces, above the eager limit where the receiver cannot read the sender (HBMCOLL_P2P_CMA=0
 *    forces it): a LONG cell with the length and the first 4032 bytes, then CHUNK cells,
 *    pipelined through the ring; the sender pushes as cells free up: any p2p wait of its
 *    rank does, and while the rank is elsewhere its helper thread does (p2p_helper.c), once
 *    the receiver has waited 20 ms and asked for it. Two copies.
 *
 * Non-overtaking: each rank keeps, per destination, a queue of sends not yet wholly in the
 * channel; a new send joins behind them, so cells enter every channel in send order, and the
 * receiver reads each channel in cell order.
 *
 * Waking. Each rank has a doorbell line at the start of the area: a futex word and a count of
 * its threads asleep on it. Who publishes something a rank may wait for (a cell for it, a
 * tail it sends against, a DONE) does a sequentially consistent fence and reads that count; only
 * when someone sleeps does it bump the word and FUTEX_WAKE. A waiter bumps the count, fences,
 * looks once more, then sleeps on the word it read before: either it sees what was published,
 * or the publisher sees it asleep (Dekker, as sync.c's flags). The common case costs the
 * publisher one fence and one read of a line nobody writes.
 *
 * Cost: a channel is 1 KiB of counters plus cells x 4 KiB: 33 KiB at the default 8 cells, per
 * ordered pair, so P x P x 33 KiB of address space (2 ranks: 132 KiB; 64 ranks: 132 MiB). The
 * area is not pre-faulted (unlike the control lines and slots), so only channels that carry
 * messages ever take memory: a ring of 64 ranks passing to their neighbours uses 64 x 33 KiB.
 * The segment's layout changed with it (COLL_SEG_MAGIC "hbcoll09" then).
 */
#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "p2p.h"

void coll__p2p_ring(coll__p2p_t *p, int rank) {
  coll__p2p_bell_t *b = &p->bells[rank];
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load_explicit(&b->sleepers, memory_order_relaxed) == 0) return;
  atomic_fetch_add_explicit(&b->bell, 1, memory_order_seq_cst);
  syscall(SYS_futex, &b->bell, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

void coll__p2p_wake_all(coll_comm_t *c) {
  if (c->hdr == NULL || c->hdr->p2p_off == 0) return;
  coll__p2p_bell_t *bells = (coll__p2p_bell_t *)(c->base + c->hdr->p2p_off);
  for (int r = 0; r < c->size; r++) {
    atomic_fetch_add_explicit(&bells[r].bell, 1, memory_order_seq_cst);
    syscall(SYS_futex, &bells[r].bell, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
  }
}

/* Between creation's two barriers: every rank's probe word is published (cma.c). */
void coll__p2p_probe(coll_comm_t *c) {
  int ok = c->params.p2p_cma && coll__cma_reads_peers(c);
  atomic_store(&c->ctl[c->rank].p2p_cma, ok ? 1 : 2);
}

int coll__p2p_pulls(coll__p2p_t *p, int peer) {
  return peer == p->rank || atomic_load_explicit(&p->c->ctl[peer].p2p_cma, memory_order_relaxed) == 1;
}

int coll__p2p_pull(coll__p2p_t *p, int source, void *dst, uint64_t addr, size_t n) {
  if (n == 0) return 0;
  if (source == p->rank) {
    memcpy(dst, (const void *)(uintptr_t)addr, n);
    return 0;
  }
  return coll__cma_copy(p->c, source, dst, addr, n, 0); /* fails the communicator (ESRCH: lost) */
}

int coll__p2p_room(coll__p2p_t *p, int dest) {
  if (p->sent[dest] - p->tail_seen[dest] < p->cells) return 1;
  coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, dest);
  p->tail_seen[dest] = atomic_load_explicit(&ch->tail, memory_order_acquire);
  return p->sent[dest] - p->tail_seen[dest] < p->cells;
}

/* A free rendezvous word for number n: never used, or its last user is over. */
static int channel_rdv_free(coll__p2p_chan_t *ch, uint64_t n) {
  uint64_t w = atomic_load_explicit(&ch->rdv[n % COLL_P2P_RDV], memory_order_acquire);
  return w == 0 || (w & 3) >= RDV_DONE;
}

void coll__p2p_push(coll__p2p_t *p, int dest) {
  coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, dest);
  coll__p2p_list_t *q = &p->outq[dest];
  uint64_t first = p->sent[dest];
  coll__p2p_op_t *op;
  while ((op = q->head) != NULL && coll__p2p_room(p, dest)) {
    coll__p2p_cell_t *cell = coll__p2p_cell(p, ch, p->sent[dest]);
    cell->tag = op->tag;
    cell->bytes = op->bytes;
    if (op->bytes <= COLL_P2P_EAGER_MAX) {
      cell->kind = P2P_EAGER;
      cell->len = op->bytes;
      if (op->bytes) memcpy(coll__p2p_payload(cell), op->buf, op->bytes);
      p->sent[dest]++;
      coll__p2p_list_remove(q, op);
      coll__p2p_finish(p, op, 0);
      continue;
    }
    if (coll__p2p_pulls(p, dest)) {
      uint64_t n = p->rdv_next[dest] + 1;
      if (!channel_rdv_free(ch, n)) break; /* 64 in flight: wait for the oldest */
      atomic_store_explicit(&ch->rdv[n % COLL_P2P_RDV], n << 2 | RDV_POSTED, memory_order_relaxed);
      cell->kind = P2P_RTS;
      cell->len = 0;
      cell->addr = (uint64_t)(uintptr_t)op->buf;
      cell->rdv = n;
      p->rdv_next[dest] = n;
      op->rdv = n;
      p->sent[dest]++;
      coll__p2p_list_remove(q, op);
      op->stage = OP_PULL_WAIT;
      coll__p2p_list_push(&p->pulls, op);
      continue;
    }
    size_t len = op->bytes - op->off < COLL_P2P_EAGER_MAX ? op->bytes - op->off : COLL_P2P_EAGER_MAX;
    cell->kind = op->off == 0 ? P2P_LONG : P2P_CHUNK;
    cell->len = len;
    memcpy(coll__p2p_payload(cell), op->buf + op->off, len);
    op->off += len;
    p->sent[dest]++;
    if (op->off == op->bytes) {
      coll__p2p_list_remove(q, op);
      coll__p2p_finish(p, op, 0);
    }
  }
  if (p->sent[dest] != first) {
    atomic_store_explicit(&ch->head, p->sent[dest], memory_order_release);
    coll__p2p_ring(p, dest);
  }
}
