/*
 * p2p_copy.c - a large rendezvous copied by both ends at once.
 *
 * Why. A rendezvous is one copy (p2p_channel.c): the receiver reads the sender's buffer with
 * process_vm_readv while the sender waits. On an idle machine that is the fastest there is for
 * one core; but the sender's core idles, and on a loaded one (more runnable threads than
 * cores) a process gets CPU time per runnable thread, so one thread copying 1 MiB got it at a
 * quarter of a core, and lost to the socket path, whose sender and receiver threads each copy
 * (975 us against 567 us one way with a busy process per core). Here the waiting sender copies
 * too.
 *
 * How. From COPY_MIN bytes, the receiver cuts the copy into COPY_CHUNK chunks and publishes,
 * in the channel's co_* line, its buffer's address, the length and a claim word
 * (rendezvous number << 24 | chunks claimed), then rings the sender. Each side claims the next
 * chunk (the receiver by fetch-add, the sender by compare-and-swap that also checks the
 * number, so a late helper never claims a chunk of the next message) and copies it: the
 * receiver reads it (process_vm_readv), the sender writes it (process_vm_writev, allowed
 * wherever the sender's own probe of every peer worked: the same ptrace check). co_done counts
 * the chunks copied; the receiver, once out of chunks to claim, waits for the sender's last
 * one, then finishes the rendezvous as before (DONE). A sender that is not in a wait never
 * helps and costs nothing: the receiver claims every chunk itself, in 64 KiB calls instead of
 * one (the kernel pins and copies 16 pages at a time either way). A sender whose copy fails
 * says so (co_err) and the receiver reads the whole message again; a sender that dies
 * mid-chunk is found by the receiver's check of it, as in any wait.
 */
#include <errno.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>

#include "p2p.h"

#define COPY_CHUNK ((size_t)64 << 10)
#define COPY_MIN ((size_t)256 << 10)
#define COPY_MAX_CHUNKS ((uint64_t)1 << 23) /* the claim word's low 24 bits */
#define COPY_TAG(n) (((n) & (((uint64_t)1 << 40) - 1)) << 24)

static size_t copy_min(size_t a, size_t b) { return a < b ? a : b; }

/* Whether rank `peer` may write into this rank's memory (its probe of every rank worked). */
static int copy_writes(coll__p2p_t *p, int peer) {
  return atomic_load_explicit(&p->c->ctl[peer].p2p_cma, memory_order_relaxed) == 1;
}

/* Until the sender's chunks are in: spin a little, then sleep on the doorbell it rings. */
static int copy_wait_done(coll__p2p_t *p, coll__p2p_chan_t *ch, int source, uint64_t chunks) {
  coll__p2p_bell_t *bell = &p->bells[p->rank];
  for (long i = 0; atomic_load_explicit(&ch->co_done, memory_order_acquire) < chunks; i++) {
    if (i < 4096) continue;
    uint32_t b = atomic_load_explicit(&bell->bell, memory_order_seq_cst);
    atomic_fetch_add_explicit(&bell->sleepers, 1, memory_order_seq_cst);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load_explicit(&ch->co_done, memory_order_acquire) < chunks) {
      struct timespec ts = {0, 2000000L};
      syscall(SYS_futex, &bell->bell, FUTEX_WAIT, b, &ts, NULL, 0);
    }
    atomic_fetch_sub_explicit(&bell->sleepers, 1, memory_order_seq_cst);
    if ((i & 15) == 15 && coll__peer_gone(p->c, source))
      return coll__fail(p->c, COLL_EPEERLOST, "rank %d is gone (pid %d) while rank %d copied its message; "
                        "the communicator is closed", source, (int)p->c->ctl[source].pid, p->rank);
  }
  return 0;
}

int coll__p2p_copy_in(coll__p2p_t *p, int source, uint64_t n, void *dst, uint64_t addr, size_t len) {
  uint64_t chunks = (len + COPY_CHUNK - 1) / COPY_CHUNK;
  if (len < COPY_MIN || source == p->rank || chunks >= COPY_MAX_CHUNKS || !copy_writes(p, source))
    return coll__p2p_pull(p, source, dst, addr, len);
  coll__p2p_chan_t *ch = coll__p2p_chan(p, source, p->rank);
  ch->co_dst = (uint64_t)(uintptr_t)dst;
  ch->co_len = len;
  atomic_store_explicit(&ch->co_err, 0, memory_order_relaxed);
  atomic_store_explicit(&ch->co_done, 0, memory_order_relaxed);
  atomic_store_explicit(&ch->co_claim, COPY_TAG(n), memory_order_release);
  coll__p2p_ring(p, source); /* a sender asleep in its wait comes to help */
  int rc = 0;
  for (;;) {
    uint64_t k = (atomic_fetch_add(&ch->co_claim, 1) & (COPY_MAX_CHUNKS * 2 - 1));
    if (k >= chunks) break;
    size_t off = (size_t)k * COPY_CHUNK;
    int r = coll__p2p_pull(p, source, (uint8_t *)dst + off, addr + off, copy_min(COPY_CHUNK, len - off));
    if (r && rc == 0) rc = r;
    atomic_fetch_add_explicit(&ch->co_done, 1, memory_order_release);
  }
  int r = copy_wait_done(p, ch, source, chunks);
  if (r && rc == 0) rc = r;
  if (rc == 0 && atomic_load(&ch->co_err)) rc = coll__p2p_pull(p, source, dst, addr, len);
  return rc;
}

void coll__p2p_copy_help(coll__p2p_t *p, coll__p2p_op_t *op) {
  if (op->peer == p->rank || !copy_writes(p, p->rank)) return;
  coll__p2p_chan_t *ch = coll__p2p_chan(p, p->rank, op->peer);
  uint64_t tag = COPY_TAG(op->rdv);
  uint64_t w = atomic_load_explicit(&ch->co_claim, memory_order_acquire);
  while ((w & ~(COPY_MAX_CHUNKS * 2 - 1)) == tag) {
    size_t len = ch->co_len; /* published before the claim word */
    uint64_t k = w & (COPY_MAX_CHUNKS * 2 - 1), chunks = (len + COPY_CHUNK - 1) / COPY_CHUNK;
    if (k >= chunks) return;
    if (!atomic_compare_exchange_weak(&ch->co_claim, &w, w + 1)) continue;
    size_t off = (size_t)k * COPY_CHUNK, m = copy_min(COPY_CHUNK, len - off);
    struct iovec li = {op->buf + off, m}, ri = {(void *)(uintptr_t)(ch->co_dst + off), m};
    ssize_t got;
    do
      got = process_vm_writev(p->c->ctl[op->peer].pid, &li, 1, &ri, 1, 0);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)m) atomic_store(&ch->co_err, 1); /* the receiver reads it all again */
    atomic_fetch_add_explicit(&ch->co_done, 1, memory_order_release);
    coll__p2p_ring(p, op->peer);
    w = atomic_load_explicit(&ch->co_claim, memory_order_acquire);
  }
}
