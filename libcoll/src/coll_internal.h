/*
 * internal.h - private structures of libcoll shared by its .c files.
 *
 * The shared segment (one memfd per communicator) is laid out as
 *
 *   [ header | ctl[0..P-1] | slots: P x 2 parities x slot_bytes | arena: P x arena_bytes |
 *     point-to-point: P doorbells, P x P channels (p2p.h) ]
 *
 * ctl[r] is written only by rank r (single writer), except `sleepers`, which
 * waiters bump before they sleep on r's futex word. Every collective walks
 * through numbered "rounds"; a rank publishes `arrive = t` when its data for
 * round t is in place and `done = t` when it has finished reading what
 * others published for round t. Both only grow, so no flag is ever cleared
 * and there is no ABA.
 */
#ifndef COLL_INTERNAL_H
#define COLL_INTERNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#include "coll.h"
#include "transport.h"

#define COLL_LINE 128 /* two 64 B lines: Intel's adjacent-line prefetcher */
#define COLL_SEG_MAGIC 0x6862636f6c6c3132ull /* "hbcoll12": header layout version */
#define COLL_TEXT_MAX 256

/* What a rank says it is calling; peers compare it before moving data (round.c). */
struct coll__desc {
  uint64_t seq;   /* collective number on this communicator, from 1 */
  uint64_t count;
  uint64_t send_off; /* segment offset of the send buffer if it is in the arena, else 0 */
  uint64_t recv_off; /* same for the receive buffer */
  /* a message of up to COLL_INLINE_MAX bytes rides here (round.h: coll__post_inline): peers
   * read it from the line they read to compare, with no slot line to fetch after it */
  uint8_t payload[8];
  int32_t root;
  uint8_t kind, dtype, op;
  uint8_t algo;        /* the algorithm this rank picked: must agree too */
  uint8_t single_copy; /* 1: the offsets above are addresses in this rank's process (cma.c) */
};
_Static_assert(sizeof(struct coll__desc) == 56, "two descriptors and two flags fill one line pair");

typedef struct {
  /* line 0: polled by peers */
  _Atomic uint64_t arrive;
  _Atomic uint64_t done;
  coll__desc_t desc[2]; /* by seq & 1: never overwritten while a peer may read it */
  /* line 1: sleeping and identity */
  _Alignas(COLL_LINE) _Atomic uint32_t wake; /* bumped after every publish; futex word */
  _Atomic uint32_t sleepers; /* waiters asleep on `wake` */
  int32_t pid;          /* in the rank's own PID namespace */
  _Atomic int32_t left; /* this rank closed the communicator */
  uint64_t pidns;       /* inode of its PID namespace, 0 unknown: is `pid` ours too? */
  uint64_t cma_addr, cma_value; /* single-copy probe word (cma.c) */
  _Atomic int32_t cma_ok;       /* 1: read every peer's probe, 2: could not */
  _Atomic int32_t p2p_cma;      /* the same for point-to-point (whatever HBMCOLL_CMA says, unless
                                 * HBMCOLL_P2P_CMA=0): 1 it pulls large messages itself */
  /* lines 2-3: written once at creation */
  _Alignas(COLL_LINE) uint64_t cpumask[16]; /* CPUs this rank may run on (first 1024) */
  int32_t pu, tile, cluster; /* its first CPU, its L2's, its NUMA node (-1 none): its place in
                              * the tree (tree.c) */
  /* line 4: a push's slice of this rank (algo_allreduce.c), written by whichever rank claims it */
  _Alignas(COLL_LINE) _Atomic uint64_t slice_claim; /* round << COLL_SLICE_RANK_BITS | claimant */
  _Atomic uint64_t slice_done;                      /* the last round it was written in */
} coll__ctl_t;
_Static_assert(offsetof(coll__ctl_t, wake) == COLL_LINE, "flags and descriptors fill one line pair");

typedef struct {
  uint64_t magic;
  int32_t size;
  int32_t roomy; /* a CPU for every rank, as rank 0 saw it at creation (the same for all) */
  uint64_t ctl_off, slot_off, slot_bytes, arena_off, arena_bytes, total_bytes;
  uint64_t stream_min; /* creator's HBMCOLL_STREAM_MIN: the same on every rank */
  uint64_t push_min;   /* creator's HBMCOLL_PUSH_MIN, likewise (all ranks push, or none) */
  uint64_t push_stream_min; /* creator's HBMCOLL_PUSH_STREAM_MIN */
  uint64_t small_max;  /* creator's HBMCOLL_SMALL_MAX, likewise: ranks that read different values
                        * (a tuning cache rewritten between their starts) still pick alike */
  uint32_t cma_kinds;  /* creator's HBMCOLL_CMA: bit (1 << kind) per collective that may use
                        * single copy (when every rank allows it and it works between every
                        * pair: coll_comm_t.cma) */
  uint32_t cma_auto;   /* creator's HBMCOLL_CMA is auto: every rank probes (cma_probe.c) */
  uint64_t cma_min;    /* creator's HBMCOLL_CMA_MIN: a gather's ranks all choose alike */
  int32_t stage_auto;  /* creator's HBMCOLL_STAGE_STREAM_MIN is auto: every rank probes
                        * (stage_probe.c), or none does */
  uint64_t p2p_off, p2p_cells, p2p_stride; /* point-to-point area (p2p.h): where, cells per
                                            * channel, bytes per channel */
  /* failure state shared by all ranks: first writer wins */
  _Atomic int32_t abort_code;
  _Atomic int32_t abort_rank;
  _Atomic int32_t abort_ready; /* text below and abort_seq are complete */
  uint64_t abort_seq;          /* the collective (seq) the failing rank was in */
  uint8_t secret[16]; /* random, from rank 0: names split rendezvous (never seen outside) */
  char abort_text[COLL_TEXT_MAX];
} coll__header_t;

/* tunables, parsed once from HBMCOLL_* (param.c) */
typedef struct {
  double timeout_s;         /* 0: no limit */
  double stall_warn_s;      /* first stall warning after this long (0: none) */
  size_t slot_bytes;        /* per rank per parity */
  size_t arena_bytes;       /* per rank */
  size_t small_max;         /* allreduce: flat copy-in up to here, then rsag */
  size_t stream_min;        /* outputs written with streaming stores from here */
  size_t push_min;          /* allreduce: arena buffers pushed from here */
  size_t push_stream_min;   /* and pushed with streaming stores from here */
  long spin_iters;          /* <0: automatic from cores vs ranks */
  int algo[COLL_KIND_COUNT]; /* forced algorithm id, 0 = auto */
  int cma;                  /* HBMCOLL_CMA: 0 none, 1 bcast and gather, 2 gather, 3 bcast,
                             * COLL_CMA_AUTO gather unless staging measured faster */
  size_t cma_min;           /* bcast/gather: single copy from here (HBMCOLL_CMA_MIN) */
  size_t rep_movsb_min;     /* ordinary copies from here use rep movsb (stream_copy.c) */
  size_t stage_stream_min;  /* copies into a slot a peer reads use streaming stores from here */
  int stage_stream_auto;    /* HBMCOLL_STAGE_STREAM_MIN unset or auto: measured (stage_probe.c) */
  size_t p2p_cells;         /* point-to-point cells per ordered pair (HBMCOLL_P2P_CELLS) */
  int p2p_cma;              /* HBMCOLL_P2P_CMA: 0 never pull large messages with CMA */
  int pipeline_chunks;      /* HBMCOLL_PIPELINE_CHUNKS: the allreduce across nodes' chunks, 0 measured */
} coll__params_t;

typedef struct coll__arena coll__arena_t;
typedef struct coll__tree coll__tree_t;
typedef struct coll__worker coll__worker_t;
typedef struct coll__p2p coll__p2p_t;
typedef struct coll__span coll__span_t;

struct coll_comm {
  int rank, size;
  const coll__transport_t *tp; /* how bytes and signals reach the other ranks */
  char *key;
  coll__params_t params;
  /* mapping */
  int fd;
  uint8_t *base;
  size_t map_bytes;
  coll__header_t *hdr;
  coll__ctl_t *ctl;
  /* round and collective counters, advanced identically on every rank (round.c) */
  uint64_t round;
  uint64_t seq;
  uint64_t extra_seq;         /* descriptors not of the caller's collectives (creation's
                               * barriers, a 2-rank allreduce's hand-over from flat to
                               * rsag): messages count calls */
  uint64_t splits;
  uint64_t unchecked_seq;     /* my last call returned before its peers compared descriptors
                               * (round.h: coll__round_unchecked), 0 none */
  uint64_t unchecked_round;   /* its first round */
  uint64_t push_open_seq;     /* a push I left before every peer finished it (a peer may still
                               * compare its descriptor: algo_allreduce.c), 0 none */
  uint64_t push_open_round;   /* its round */
  uint64_t slot_last_read[2]; /* round in which readers finish with my slot[p] */
  int slot_reader[2];         /* the one reader of slot[p], -1 all, -2-R my children in the
                               * tree rooted at R */
  uint64_t *seen_done;        /* per peer: done >= this is known */
  int *pidfd;                 /* per peer, from the bootstrap; -1 if none */
  long spin_iters;
  int yield_budget; /* sched_yield calls before sleeping on the futex */
  double stage_probe_s[2]; /* best probe batch, ordinary and streaming staging (stage_probe.c) */
  double cma_probe_s[2];   /* best probe batch of gathers, staged and single copy (cma_probe.c) */
  size_t cma_probe_bytes;  /* the size those gathers moved per rank, 0: no probe */
  /* interrupt check, only for inline (caller thread) runs */
  coll_interrupt_fn interrupt_fn;
  void *interrupt_arg;
  int allow_interrupt;
  coll_warn_fn warn_fn; /* stall warnings (NULL: stderr) */
  void *warn_arg;
  pid_t owner_pid;       /* the process that created it: a fork()ed child may not use it */
  unsigned owner_epoch;  /* coll__fork_epoch at creation */
  int creating;    /* inside coll_comm_create (warnings say so) */
  coll_comm_t *parent; /* while a split creates this one: the communicator split */
  /* local failure record (also for errors found before the header exists) */
  int error;
  char error_text[COLL_TEXT_MAX];
  coll_place_fn place;
  void *place_arg;
  int *local_of; /* node-local rank of each rank */
  coll__arena_t *arena;
  coll__tree_t *tree; /* small collectives with many ranks (tree.c); NULL while creating */
  coll__worker_t *worker;
  uint64_t cma_probe; /* the word peers read to test single copy */
  int cma;            /* single copy works between every pair (same on all ranks) */
  const char *algorithm; /* what the last collective ran as (a static string: logs, timeline) */
  coll__p2p_t *p2p;      /* point-to-point state, made at the first call (p2p.c) */
  coll__span_t *span; /* a communicator that spans nodes (nodes_comm.c): the public functions hand it
                       * there; it has no segment of its own. NULL on one node. */
};

/* ---- param.c ---- */
/* 0, or COLL_EBADARG with a sentence in err naming the malformed variable */
int coll__params_load(coll__params_t *params, char *err, size_t errlen);
/* y += alpha * x over count elements (reduce.c): the memory servers' accumulate. */
int coll__axpy(coll_dtype_t dtype, void *y, const void *x, double alpha, size_t count);
int coll__algo_id(coll_kind_t kind, const char *name); /* >0, or COLL_EBADARG */

/* ---- shm.c ---- */
int coll__segment_create(size_t bytes, int *fd_p);
int coll__segment_map(int fd, size_t bytes, uint8_t **base_p);
/* 0, or -ENOMEM (or another -errno) with a sentence in err naming the size and node */
int coll__segment_prefault(void *addr, size_t bytes, char *err, size_t errlen);

/* ---- bootstrap.c ---- */
/* Rank 0 listens and sends `fd` to every other rank; others receive it.
 * pidfds[size] (all -1 on entry) gets a pidfd of each other rank, valid in
 * this PID namespace, or -1 where the peer's kernel gave none. */
int coll__bootstrap(coll_comm_t *c, int *fd_inout, char *err, size_t errlen);

/* ---- cma.c: single copy between private buffers (process_vm_readv/writev) ---- */
#define COLL_CMA_MAX_RANKS 8
#define COLL_CMA_AUTO 4 /* params.cma's "auto" */
void coll__cma_publish_probe(coll_comm_t *c);
int coll__cma_reads_peers(const coll_comm_t *c);
void coll__cma_check_peers(coll_comm_t *c);
void coll__cma_agree(coll_comm_t *c);
int coll__cma_copy(coll_comm_t *c, int peer, void *local, uint64_t remote, size_t n, int write);

/* ---- sync.c: the shared-memory transport's flags (transport_shm.c) ---- */
void coll__publish_arrive(coll_comm_t *c, uint64_t round);
void coll__publish_done(coll_comm_t *c, uint64_t round);
#define COLL_SLICE_RANK_BITS 16 /* more ranks than this: each claims only its own slice */
int coll__claim_slice(coll_comm_t *c, int owner, uint64_t round);
void coll__publish_slice(coll_comm_t *c, int owner, uint64_t round);
int coll__wait_slice(coll_comm_t *c, int owner, uint64_t round);
int coll__wait_arrive(coll_comm_t *c, int peer, uint64_t round);
int coll__wait_done(coll_comm_t *c, int peer, uint64_t round);
/* Record a failure for every rank; returns the code to hand back. */
int coll__fail(coll_comm_t *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int coll__check_abort(coll_comm_t *c);
/* 0 while healthy, else the failure code (the same on every rank). */
int coll__aborted(coll_comm_t *c);
/* A line for a person (stall): the communicator's warn callback, or stderr. */
void coll__warn(coll_comm_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The caller's collectives numbered from 1 (creation's barriers not counted). */
static inline uint64_t coll__call_number(const coll_comm_t *c) { return c->seq - c->extra_seq; }
void coll__wake_all(coll_comm_t *c);
/* 0 while `peer`'s process lives and it has not left; 1 it died; 2 it left (closed the
 * communicator, or exited normally). */
int coll__peer_gone(coll_comm_t *c, int peer);

/* One step of a spin: the CPU's pause hint (a sibling hyperthread runs meanwhile). */
static inline void coll__relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* ---- collective.c: the dispatcher ---- */
int coll__check_args(const coll_comm_t *c, const coll_args_t *a);
/* Runs the collective in the calling thread (unaliasing first). */
int coll__execute(coll_comm_t *c, const coll_args_t *a);

/* ---- stream_copy.c ---- */
/* memcpy with non-temporal stores (plain memcpy where the CPU has none), for results far
 * larger than the caches; coll__stream_fence() after the last of them, before publishing. */
void coll__copy_stream(void *dst, const void *src, size_t n);
void coll__stream_fence(void);
/* Copy into my slot what a peer reads next: with streaming stores (then fenced) from
 * HBMCOLL_STAGE_STREAM_MIN, so the reader's loads come from memory, not from my cache. */
void coll__stage_copy(const coll_comm_t *c, void *slot, const void *src, size_t n);
/* At creation: measure whether staging copies should stream (stage_probe.c); collective. */
int coll__stage_probe(coll_comm_t *c);
/* The creation probes' timing: `calls` runs of a, then a barrier; the least time so far in *best. */
int coll__probe_batch(coll_comm_t *c, const coll_args_t *a, int calls, double *best);
/* At creation, after the single-copy verdict (cma_probe.c): with HBMCOLL_CMA=auto, whether a
 * gather's single copy stays on; collective (every rank, or none: the header says). */
int coll__cma_probe(coll_comm_t *c);
/* memcpy, or coll__copy_stream when `stream` (the caller fences). */
void coll__copy(const coll_comm_t *c, void *dst, const void *src, size_t n, int stream);
int coll__cpu_rep_movsb_fast(void);
/* aliasing.c: if send partly overlaps recv (not an in-place form), *safe = a
 * with send pointing to a malloc'd copy in *copy (the caller frees it) and 1
 * is returned; 0: nothing to do; -ENOMEM. */
int coll__unalias(const coll_comm_t *c, const coll_args_t *a, coll_args_t *safe, void **copy);

/* ---- arena.c ---- */
int coll__arena_init(coll_comm_t *c);
void coll__arena_destroy(coll_comm_t *c);
/* segment offset of ptr if [ptr, ptr+bytes) is in my arena, else 0 */
uint64_t coll__arena_offset(const coll_comm_t *c, const void *ptr, size_t bytes);
long coll__job_cpus(coll_comm_t *c); /* CPUs usable by the job (masks, quota) */

/* ---- request.c: blocking and nonblocking runs ---- */
void coll__worker_stop(coll_comm_t *c);
/* The request engine, for any owner (a communicator; the layer across nodes, hier.c): a thread
 * that runs queued requests in order with execute(owner, args). coll__worker_get starts it on
 * first use; coll__worker_queue adds a request (coll_req_wait/test/free work on it);
 * coll__worker_pending counts those queued or running; coll__worker_end stops it (queued
 * requests fail with COLL_EABORTED) and sets *w_p to NULL. */
int coll__worker_get(coll__worker_t **w_p, int (*execute)(void *owner, const coll_args_t *a), void *owner);
int coll__worker_queue(coll__worker_t *w, const coll_args_t *a, coll_req_t **req_p);
int coll__worker_pending(coll__worker_t *w);
void coll__worker_end(coll__worker_t **w_p);
/* In a fork()ed child: drop the parent's worker without joining it. */
void coll__worker_forget(coll_comm_t *c);

/* ---- p2p*.c: point-to-point (p2p.h) ---- */
/* At creation, between the two barriers: can this rank read every peer (ctl.p2p_cma)? */
void coll__p2p_probe(coll_comm_t *c);
/* Ring every rank's point-to-point doorbell (failures, leaving). */
void coll__p2p_wake_all(coll_comm_t *c);
/* At coll_comm_free: requests still pending fail with COLL_EABORTED. */
void coll__p2p_destroy(coll_comm_t *c);
/* request.c: a request around a point-to-point operation (owned by the request), and what its
 * wait, test, free, status and cancel call (p2p.c on a node, nodes_p2p.c across nodes). */
typedef struct {
  int (*wait)(void *op, double timeout_s);
  int (*test)(void *op, int *result_p);
  void (*free)(void *op);
  int (*status)(void *op, coll_status_t *status_p);
  int (*cancel)(void *op);
} coll__req_ops_t;
int coll__req_wrap_p2p(void *op, const coll__req_ops_t *ops, coll_req_t **req_p);
/* ---- nodes_comm.c ---- */
/* The communicator whose arena and settings a call uses: c, or the node's under a spanning c. */
coll_comm_t *coll__comm_here(const coll_comm_t *c);

/* ---- comm.c ---- */
/* A disagreement's sentence for coll_comm_error while the communicator goes on (vcoll.c); ""
 * at every call's start, so no sentence outlives the call it was about. */
void coll__keep_text(coll_comm_t *c, const char *text);
/* Bumped in every fork()ed child (pthread_atfork): a communicator made in an
 * earlier epoch belongs to an ancestor. No system call on the hot path. */
extern _Atomic unsigned coll__fork_epoch;
/* 1 in a fork()ed child of the process that created the communicator. */
static inline int coll__forked(const coll_comm_t *c) {
  return c->owner_epoch != atomic_load_explicit(&coll__fork_epoch, memory_order_relaxed);
}

#endif /* COLL_INTERNAL_H */
