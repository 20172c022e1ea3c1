/*
 * coll.h - the one public header of libcoll, hbmcoll's C core.
 *
 * libcoll runs collectives between the processes of one node over a shared
 * memory segment (memfd, passed between ranks over an abstract Unix socket),
 * and, for a job that spans nodes (coll_job_create), between the nodes over the
 * bridge: RDMA writes through libfabric (verbs on InfiniBand and RoCE, tcp
 * elsewhere), composed with the node's shared memory in one coll_comm_t.
 *
 * Conventions (libuv/UCX style):
 *  - every int function returns 0 on success or a negative code: -errno for a
 *    system failure, or one of the COLL_E* library codes below;
 *  - output parameters end in _p, come last and are written only on success;
 *  - coll_comm_t and coll_req_t are opaque;
 *  - a communicator is used by one thread at a time (the Python layer holds a
 *    lock); requests run on the communicator's progress thread.
 * Nothing here calls abort() or exit(); nothing prints unless logging is on.
 */
#ifndef COLL_H
#define COLL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- errors ------------------------------------------------------------ */
/* Library codes live in a reserved range far from any errno. */
#define COLL_ERRNO_MAP(XX)                                                        \
  XX(EMISMATCH, -20001, "ranks disagree on the arguments of a collective")       \
  XX(EPEERLOST, -20002, "a peer process died or left the communicator")          \
  XX(EABORTED, -20003, "the communicator was aborted by an earlier failure")     \
  XX(EINTERRUPTED, -20004, "interrupted by a signal while waiting")              \
  XX(EBOOTSTRAP, -20005, "ranks could not meet to build the communicator")       \
  XX(EBADARG, -20006, "invalid argument")                                         \
  XX(ENOTSUP, -20007, "not supported by this build or environment")              \
  XX(EFORKED, -20008, "the communicator belongs to the process that created it, "   \
                      "not to this forked child")

typedef enum {
#define COLL_ERR_ENUM_(name, value, text) COLL_##name = value,
  COLL_ERRNO_MAP(COLL_ERR_ENUM_)
#undef COLL_ERR_ENUM_
  COLL_ERR_LAST_ = -20009
} coll_errno_t;

/* Text for any code this library returns (library codes and -errno); "success" for 0,
 * "unknown error" for anything else. Static strings, never NULL. */
const char *coll_strerror(int code);
/* Short name: "EMISMATCH", "ETIMEDOUT", ... ("UNKNOWN" otherwise). */
const char *coll_err_name(int code);

/* ---- data types and reduction operators -------------------------------- */
typedef enum {
  COLL_INT8 = 0,
  COLL_UINT8,
  COLL_INT32,
  COLL_INT64,
  COLL_FLOAT16,
  COLL_BFLOAT16,
  COLL_FLOAT32,
  COLL_FLOAT64,
  COLL_DTYPE_COUNT
} coll_dtype_t;

typedef enum { COLL_SUM = 0, COLL_PROD, COLL_MIN, COLL_MAX, COLL_AVG, COLL_OP_COUNT } coll_op_t;

/* Element size in bytes, or 0 for an unknown dtype. Names are "float32",
 * "sum", ...; "unknown" for a value out of range. */
/* Bytes per element, or 0 for an unknown dtype. */
size_t coll_dtype_size(coll_dtype_t dtype);
/* Static names ("float32", "sum", ...), "unknown" for a value out of range; never NULL. */
const char *coll_dtype_name(coll_dtype_t dtype);
const char *coll_op_name(coll_op_t op);

/* out[i] = op(inputs[0][i], ..., inputs[n-1][i]) for i < count, left to right
 * over the inputs, so every caller gets the bitwise same result. float16 and
 * bfloat16 accumulate in float32 and round once (to nearest even). Integer
 * SUM/PROD wrap around; COLL_AVG divides the (wrapped) sum by `divisor`,
 * integers with truncating division, floats in their accumulation type.
 * MIN/MAX propagate a NaN from any input (NumPy's minimum/maximum, MPI): the
 * first NaN in input order is the one kept; of equal values (+0/-0) the
 * earlier input wins. `out` may be the same
 * pointer as any input (partial overlap is not supported).
 * Returns 0 (count == 0 touches nothing), or COLL_EBADARG for an unknown
 * dtype/op, ninputs == 0, divisor == 0 with COLL_AVG, or a NULL pointer. */
int coll_reduce_local(coll_dtype_t dtype, coll_op_t op, void *out, const void *const *inputs,
                      size_t ninputs, size_t count, size_t divisor);

/* ---- communicators ------------------------------------------------------ */
typedef struct coll_comm coll_comm_t;
typedef struct coll_req coll_req_t;

/* Called from the slow path of long waits (every ~50 ms) by the thread that
 * runs the collective; returns non-zero to abandon the wait with
 * COLL_EINTERRUPTED (the Python layer checks for Ctrl-C here). */
typedef int (*coll_interrupt_fn)(void *arg);

/* Places a fresh shared mapping before its first touch (the numa/ layer's
 * coll_numa_place_segment, supplied by the caller so libcoll does not depend
 * on hwloc): `local_ranks` are the node-local ranks that use it most. */
typedef int (*coll_place_fn)(void *arg, void *addr, size_t len, const int *local_ranks, int n);

/* Receives one line (no newline) the library wants a person to read: a
 * stall ("rank 0 has waited 60 s in allreduce #12 for rank 3 ..."). Called
 * from the waiting thread, without any lock of the library held. */
typedef void (*coll_warn_fn)(void *arg, const char *text);

typedef struct {
  int rank;               /* this process, 0..size-1 */
  int size;               /* processes in the communicator, all on this node */
  const char *job_key;    /* same string on every rank of one job, different for every other
                           * job; it names the rendezvous, so it must hold a secret of the job
                           * (another local user who can guess it can delay the start) */
  double timeout_s;       /* hard limit for every wait; <= 0: HBMCOLL_TIMEOUT, else none
                           * (a dead peer is found in ~20 ms either way; a live, slow one only
                           * makes the waiters warn, after HBMCOLL_STALL_WARN seconds) */
  coll_warn_fn warn;      /* optional: stall warnings; NULL writes them to stderr */
  void *warn_arg;
  coll_place_fn place;    /* optional: rank 0 places the segment with it */
  void *place_arg;
  const int *local_ranks; /* optional: node-local rank of each rank (default: the rank) */
  coll_interrupt_fn interrupt; /* optional: checked while waiting (also at creation) */
  void *interrupt_arg;
} coll_comm_config_t;

/* Collective over `size` processes: build a communicator. Rank 0 creates the
 * shared segment and listens on an abstract Unix socket named after job_key;
 * the others connect (retrying until the timeout, if any), prove they are the
 * same user and know the whole key, and receive the segment's fd. Returns 0
 * and *comm_p, or COLL_EBOOTSTRAP (peers never came, disagree on size or
 * ranks, or a persistent error such as EMFILE ended the wait: the text says
 * which), COLL_EBADARG (also a malformed HBMCOLL_* variable: the text names
 * it and the values it takes), -ENOMEM, or another -errno. The communicator
 * belongs to the calling process: in a fork()ed child every call on it
 * returns COLL_EFORKED, and coll_comm_free there releases only the child's
 * own resources (the parent's communicator is not touched). */
int coll_comm_create(const coll_comm_config_t *config, coll_comm_t **comm_p);

/* ---- a job that spans nodes ------------------------------------------- */
/* Options of coll_job_create; a zeroed struct (or NULL) takes every default. */
typedef struct {
  double timeout_s;       /* hard limit for every wait; <= 0: HBMCOLL_TIMEOUT, else none (the
                           * nodes then wait 900 s for each other at creation) */
  coll_warn_fn warn;      /* optional: stall warnings, and the rendezvous' "has waited 10 s" */
  void *warn_arg;
  coll_place_fn place;    /* optional: as in coll_comm_config_t, for the node's segment */
  void *place_arg;
  coll_interrupt_fn interrupt; /* optional: checked while waiting, also for other nodes */
  void *interrupt_arg;
} coll_job_config_t;

/* Collective over every rank of the job a launcher started (hbmcoll-run, torchrun, mpiexec,
 * srun): join it, on one node or across nodes, reading the same variables as Python's
 * hbmcoll.init():
 *  - who this rank is: HBMCOLL_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE (hbmcoll-run), else torchrun's
 *    RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, MPICH's PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/
 *    MPI_LOCALNRANKS, Open MPI's OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID/SLURM_NTASKS/
 *    SLURM_LOCALID/SLURM_TASKS_PER_NODE; none of them: a job of one process;
 *  - HBMCOLL_JOB_KEY: the job's secret, the same on every rank (hbmcoll-run sets one on one node;
 *    across nodes give every node the same, e.g. `openssl rand -hex 16`). It names the node's
 *    rendezvous and proves membership between nodes (HMAC-SHA256 over fresh nonces: it is never
 *    sent);
 *  - across nodes (local size < size): the rendezvous at HBMCOLL_MASTER, else MASTER_ADDR (rank 0's
 *    node; under srun the step's first node; IPv4, or IPv6 as `fd00::1` or `[fd00::1]`), port HBMCOLL_PORT, else MASTER_PORT + 1, else 29600,
 *    or the first port of HBMCOLL_PORTS=LO-HI (which also confines the bridge's endpoints to
 *    LO+256..HI); ring l of local ranks l meets at that port + l. The bridge's interface is
 *    HBMCOLL_IFACE, else the one this node reaches the master through; the node's name
 *    HBMCOLL_NODE, else the hostname (names must differ); HBMCOLL_TIMEOUT bounds the waits.
 * Local rank 0 of each node meets the others at the master, which checks that the nodes agree on
 * the size and protocol, that their ranks cover 0..size-1 once and that their names differ, and
 * answers everyone with the layout or with the one error of the job. Then the bridge's rings are
 * built (one per local rank every node has) and one word goes around each.
 *
 * Why a function of its own and not coll_comm_create: coll_comm_create is told its rank and size
 * and reads nothing about the launcher (the Python package, splits and MPI callers use it for one
 * node's ranks); joining a job across nodes needs the launcher's variables, a network rendezvous
 * and a secret, which coll_job_create alone reads.
 *
 * On one node the communicator is coll_comm_create's. Across nodes it is one coll_comm_t of the
 * job's rank and size: coll_run, coll_run_v, coll_start, coll_req_wait/test/free, coll_comm_rank/size,
 * coll_comm_error, coll_comm_abort, coll_comm_settle, coll_comm_free, coll_comm_algorithm
 * ("meeting", "sliced", "rings", "gather") and coll_arena_alloc (the node's arena) work on it as
 * documented, with every op and dtype; coll_set_algorithm forces the node stages' algorithms.
 * Differences: every call's arguments are met by every rank before any data moves, so a
 * disagreement is COLL_EMISMATCH on every rank and the communicator stays usable (coll_comm_error
 * then returns 0 with the disagreement's sentence); any other failure (COLL_EPEERLOST when a rank or
 * a node is lost, -ETIMEDOUT, COLL_EINTERRUPTED, COLL_EABORTED) ends it on every rank of every
 * node; coll_comm_settle waits for the started calls; coll_comm_free is collective between the
 * nodes' ring ranks (each waits, at most 60 s, for the others' goodbye, so no endpoint closes under
 * a peer's write); coll_comm_split makes a node's communicator where a group is on one node, else
 * another that spans nodes (its own rings, found over the parent: no new rendezvous or port); in a
 * rank, a failure of either ends both, and a lost rank is COLL_EPEERLOST wherever a call needs it.
 *
 * Returns 0 and *comm_p, or COLL_EBADARG (a malformed or missing variable: the text names it),
 * COLL_EBOOTSTRAP (the nodes could not meet or do not agree: the text names the address, port and
 * node, e.g. "member 0 waited at 10.0.0.1:29601 for the other nodes 900 s: nodes a came with ranks
 * 0-1 of 4; missing: the nodes of ranks 2-3; ..."), COLL_EINTERRUPTED, -ENOMEM or another -errno;
 * on failure *comm_p is still set, to a communicator that holds only the error: read it with
 * coll_comm_error, then coll_comm_free it. See docs/multi-node.md and examples/c/allreduce_nodes.c. */
int coll_job_create(const coll_job_config_t *config, coll_comm_t **comm_p);

/* Collective over `comm`: ranks with the same color form a new communicator,
 * ordered by (key, old rank). color < 0: this rank joins none and *comm_p is
 * set to NULL. Returns 0 and *comm_p; COLL_EBADARG (NULL comm or comm_p),
 * COLL_EFORKED, -ENOMEM, any return of coll_run (the exchange of colors, which
 * fails `comm` as coll_run does) or of coll_comm_create (building the new
 * communicator). *comm_p is untouched on failure; nothing is left to free. */
int coll_comm_split(coll_comm_t *comm, int color, int key, coll_comm_t **comm_p);
/* (On a communicator that spans nodes, coll_job_create says what the groups become.) */
/* (If a rank cannot create its part (out of fds, Ctrl-C), `comm` fails on every
 * rank with that reason: the members of its group stop waiting for it.) */

/* A bcast's root and a small gather's senders return before their peers have
 * compared descriptors (as MPI's eager sends return before the receive); a
 * disagreement reaches them at their next call. This makes that check now: it
 * waits until every peer has reached this rank's last collective and compares
 * their descriptors with its own. 0, or what coll_run would return (COLL_EMISMATCH
 * naming both calls, COLL_EPEERLOST, ...), the communicator failed as coll_run
 * fails it. Call it before coll_comm_free to learn of a disagreement in the last
 * call: it first lets the request thread finish the request it runs, and requests
 * still queued fail with COLL_EABORTED, as at coll_comm_free. 0 at once when the
 * last call needs no check. */
int coll_comm_settle(coll_comm_t *comm);

/* Local: say this rank has left (peers waiting for it get COLL_EPEERLOST,
 * "rank r left before collective #n"), then release everything (threads,
 * mappings, fds). Queued requests fail with COLL_EABORTED. NULL is fine. In a
 * forked child it says nothing to the peers and only unmaps and closes. */
void coll_comm_free(coll_comm_t *comm);
/* Local: only say this rank has left; later calls on it fail. The mapping
 * stays (arena buffers remain readable) until coll_comm_free. */
void coll_comm_leave(coll_comm_t *comm);

/* Local: mark the communicator failed for every rank (they leave their waits
 * with COLL_EABORTED, or `reason` if it is a library code). */
void coll_comm_abort(coll_comm_t *comm, int reason);

/* 1 when called in a fork()ed child of the process that created comm (every
 * call on it there returns COLL_EFORKED), else 0; the creator's pid. */
int coll_comm_forked(const coll_comm_t *comm);
int coll_comm_owner_pid(const coll_comm_t *comm);

/* This rank and the number of ranks; -1 for a NULL comm. */
int coll_comm_rank(const coll_comm_t *comm);
int coll_comm_size(const coll_comm_t *comm);
/* Replace the interrupt check given at creation (NULL fn: none). */
void coll_comm_set_interrupt(coll_comm_t *comm, coll_interrupt_fn fn, void *arg);
/* The first error that failed this communicator (0 while healthy), and a
 * sentence that says what happened ("rank 3 (pid 123) died", ...), owned by
 * the communicator; COLL_EBADARG for a NULL comm. */
int coll_comm_error(const coll_comm_t *comm, const char **text_p);
/* Bit (1 << kind) for each of COLL_BCAST and COLL_GATHER whose large messages
 * copy straight between the ranks' own buffers (HBMCOLL_CMA asks for it, and
 * process_vm_readv/writev works between every pair of ranks; with "auto", the default, a
 * gather's unless staging measured faster at creation); 0 for none. */
int coll_comm_single_copy(const coll_comm_t *comm);
/* The size from which the chunks this rank stages for its peers are written with streaming
 * stores (HBMCOLL_STAGE_STREAM_MIN, or what the communicator measured when it was made:
 * 0 for none, or a NULL comm), and the probe's best times in seconds, ordinary and
 * streaming (0 where there was no probe). */
size_t coll_comm_stage_streaming(const coll_comm_t *comm, double times_s[2]);
/* What the communicator measured when it was made, with HBMCOLL_CMA=auto (the default) and
 * single copy working between every pair: the bytes per rank its probe gathered (0: no probe),
 * and the best batch's times in seconds, staged and single copy. coll_comm_single_copy says
 * which was kept. */
size_t coll_comm_single_copy_probe(const coll_comm_t *comm, double times_s[2]);
/* The algorithm the last collective on comm ran as ("flat", "rsag", "push", "tree",
 * "eager", "pipelined", "arena", "single-copy", "exchange", ...), for logs and timelines; a
 * static string, "" before the first. */
const char *coll_comm_algorithm(const coll_comm_t *comm);

/* ---- shared arena (zero-copy buffers) ---------------------------------- */
/* Local: memory inside this communicator's shared segment, `align`ed (power of
 * two, <= 4096), from this rank's own part of the arena. Collectives whose
 * buffers live here skip a copy. Returns 0 and *ptr_p; -ENOMEM when the arena
 * is full, COLL_EBADARG (NULL comm or ptr_p, a bad align, a communicator
 * without arena), COLL_EFORKED; bytes 0 gives a block of one cache line. The memory lives until coll_arena_free or coll_comm_free. */
int coll_arena_alloc(coll_comm_t *comm, size_t bytes, size_t align, void **ptr_p);
/* Give back a block of coll_arena_alloc; NULL or a pointer it did not return is ignored. */
void coll_arena_free(coll_comm_t *comm, void *ptr);
/* 1 if [ptr, ptr+bytes) lies in this rank's part of the arena. */
int coll_arena_contains(const coll_comm_t *comm, const void *ptr, size_t bytes);

/* ---- collectives -------------------------------------------------------- */
typedef enum {
  COLL_BARRIER = 0,
  COLL_BCAST,
  COLL_GATHER,
  COLL_SCATTER,
  COLL_ALLGATHER,
  COLL_REDUCE,
  COLL_ALLREDUCE,
  COLL_REDUCE_SCATTER,
  COLL_ALLTOALL,
  COLL_KIND_COUNT
} coll_kind_t;

/* One collective call. `count` is elements per rank contribution:
 *  bcast:          buf[count] in place (root sends, others receive)
 *  gather:         send[count] -> recv[size*count] on root (recv unused elsewhere)
 *  scatter:        send[size*count] on root -> recv[count]
 *  allgather:      send[count] -> recv[size*count]
 *  reduce:         send[count] -> recv[count] on root
 *  allreduce:      send[count] -> recv[count]
 *  reduce_scatter: send[size*count] -> recv[count]
 *  alltoall:       send[size*count] -> recv[size*count]
 * send == recv means in place (where the shapes allow it); so do my block of
 * recv as send (gather, allgather) and my block of send as recv (scatter,
 * reduce_scatter). Any other overlap of send and recv is allowed and costs a
 * private copy of send. */
typedef struct {
  coll_kind_t kind;
  coll_dtype_t dtype;
  coll_op_t op;
  int root;
  size_t count;
  const void *send;
  void *recv;
} coll_args_t;

/* Blocking: runs the collective. Every rank must call the same collectives in
 * the same order with matching kind, dtype, count, op and root; any
 * disagreement makes it return COLL_EMISMATCH on every rank. Other returns:
 * COLL_EPEERLOST, -ETIMEDOUT, COLL_EINTERRUPTED, COLL_EABORTED: after any of
 * these the communicator is failed for good (later calls return the same
 * failure; the interrupted rank itself sees COLL_EPEERLOST later). COLL_EBADARG
 * is found before anything is communicated and leaves the communicator usable. */
int coll_run(coll_comm_t *comm, const coll_args_t *args);

/* Nonblocking: queue the collective on the communicator's progress thread and
 * return at once. Buffers must stay valid until the request completes.
 * Returns 0 and *req_p (free it with coll_req_free); COLL_EBADARG (NULL
 * pointers, or the arguments coll_run would refuse before communicating),
 * COLL_EFORKED, the communicator's failure if it has one, -ENOMEM or the
 * -errno of starting the progress thread. Nothing is queued on failure. */
int coll_start(coll_comm_t *comm, const coll_args_t *args, coll_req_t **req_p);
/* Wait up to timeout_s (< 0: for ever) for completion. Returns the
 * collective's result (any return of coll_run), -ETIMEDOUT if this wait ran
 * out (the request goes on), or COLL_EBADARG for a NULL req. */
int coll_req_wait(coll_req_t *req, double timeout_s);
/* 1 when complete (*result_p then holds its result), 0 while running;
 * COLL_EBADARG for a NULL req. */
int coll_req_test(coll_req_t *req, int *result_p);
/* Release a request; waits for it first if it is still running. */
void coll_req_free(coll_req_t *req);

/* ---- collectives with a count per rank (MPI's v-variants) -------------- */
/* Blocks lie end to end in rank order (MPI's displacements are the running sums of the
 * counts); counts are elements. `kind` is one of:
 *  gather:         send[counts[rank]] -> recv[sum counts] on root
 *  allgather:      send[counts[rank]] -> recv[sum counts]
 *  scatter:        send[sum counts] on root -> recv[counts[rank]]
 *  reduce_scatter: send[sum counts] -> recv[counts[rank]] (op)
 *  alltoall:       send[sum counts] -> recv: counts[j] of this rank's go to rank j; recv gets
 *                  every rank's block for this one, in rank order
 * counts is the same array on every rank, except for alltoall, where it is this rank's row.
 * gather and allgather may pass counts NULL on every rank: each rank's send_count is its block.
 * send_count and recv_count are the elements the buffers hold; a recv of NULL with alloc set
 * is made by alloc(alloc_arg, bytes) once the result's size is known (a NULL from alloc: the
 * call goes on for the others and returns COLL_EBADARG here). send and recv must not overlap. */
typedef struct {
  coll_kind_t kind;
  coll_dtype_t dtype;
  coll_op_t op;
  int root;
  const size_t *counts;
  const void *send;
  size_t send_count;
  void *recv;
  size_t recv_count;
  void *(*alloc)(void *arg, size_t bytes);
  void *alloc_arg;
} coll_vargs_t;

/* Blocking, on any communicator. Every rank's arguments are checked against every other's
 * first (one small allgather): a call, dtype, op, root or counts that differ, a buffer whose
 * size is not what the counts say, or a missing buffer or counts on any rank make every rank
 * return COLL_EMISMATCH with the same sentence in coll_comm_error, and the communicator goes on.
 * Other returns as coll_run's (COLL_EBADARG at once for a NULL comm or args, or a kind
 * that has no v-variant). */
int coll_run_v(coll_comm_t *comm, const coll_vargs_t *args);

/* ---- point-to-point ----------------------------------------------------- */
/* Messages between two ranks of a communicator, as MPI's: through the communicator's shared
 * segment (a channel per ordered pair of ranks), never waiting for a rank that takes no part,
 * and apart from the collectives (their rounds and slots are untouched: both may be used in
 * turn on one communicator). Messages from one rank to another are matched in the order they
 * were sent (MPI's non-overtaking rule); a receive takes the first message from its source
 * (any, with COLL_ANY_SOURCE) whose tag matches (any, with COLL_ANY_TAG). Tags are >= 0.
 * A send to this rank itself works. Point-to-point calls may come from any thread, at once
 * (a lock per communicator guards their state, held only for short steps); every wait of one
 * of them moves every pending point-to-point operation of this rank along, so MPI's
 * irecv-send-wait never deadlocks.
 * On a communicator that spans nodes (coll_job_create, and its splits) the same calls go through
 * the network as libfabric tagged messages (tcp;ofi_rxm, verbs;ofi_rxm), to this node's peers too,
 * so one matching engine sees every message: the rules above hold across nodes. What differs there:
 * a long message moves only while both its ranks poll (a wait or test of any of their
 * point-to-point calls); after COLL_EMISMATCH the buffer's contents are unspecified (the provider may deliver
 * none of a message that came before its receive); a send cut short by a timeout or an interrupt
 * fails the communicator (a posted send cannot be withdrawn); a rank that dies, or a lost node,
 * ends every wait with COLL_EPEERLOST (the communicator is failed on every node). If a rank could
 * not open its endpoint, the collectives work and every point-to-point call returns COLL_ENOTSUP
 * (coll_comm_error names that rank and why). */
#define COLL_ANY_SOURCE (-1)
#define COLL_ANY_TAG (-1)

/* What a receive took: the sender's rank, its tag and the message's length in bytes (also
 * when that was more than the buffer held: then the receive returned COLL_EMISMATCH). */
typedef struct {
  int source;
  int tag;
  size_t bytes;
} coll_status_t;

/* Blocking: send buf[0..bytes) to rank `dest` with `tag`; returns once buf may be reused.
 * Up to COLL_P2P_EAGER_MAX bytes that is as soon as the message is in the channel (the
 * receiver need not be there yet); a longer message waits for the receiver to take it
 * (it copies straight from buf, or buf goes through the channel in pieces; see p2p.c).
 * Returns 0; COLL_EBADARG (NULL comm, NULL buf with bytes > 0, dest out of range, tag < 0:
 * found before anything travels); COLL_EFORKED; the communicator's failure if it has one
 * (COLL_EPEERLOST when dest died or left while this send waited for it; the communicator is
 * then failed, as a collective fails it); -ETIMEDOUT after the communicator's timeout, or
 * COLL_EINTERRUPTED when its interrupt check said so: the message is withdrawn (never
 * delivered) and the communicator stays usable, unless it was half way through the channel
 * in pieces, which fails the communicator with that code; -ENOMEM. */
int coll_send(coll_comm_t *comm, const void *buf, size_t bytes, int dest, int tag);

/* Blocking: receive the first matching message (source: a rank or COLL_ANY_SOURCE; tag: >= 0
 * or COLL_ANY_TAG) into buf[0..bytes). A shorter message fills the front of buf. Returns 0 and
 * *status_p (if not NULL: source, tag, bytes that came); COLL_EMISMATCH when the message was
 * longer than buf: buf holds its first `bytes` bytes, *status_p says its whole length, and the
 * message is consumed (this call only: the communicator stays usable); COLL_EBADARG (NULL comm,
 * NULL buf with bytes > 0, source or tag out of range); COLL_EFORKED; the communicator's
 * failure (COLL_EPEERLOST when source died or left with no matching message sent: it fails the
 * communicator); -ETIMEDOUT (the communicator's timeout) or COLL_EINTERRUPTED: the receive is
 * withdrawn and no later message lands in buf (the communicator stays usable); -ENOMEM. */
int coll_recv(coll_comm_t *comm, void *buf, size_t bytes, int source, int tag, coll_status_t *status_p);

/* Nonblocking: start the send (receive) and return at once with *req_p, a request for
 * coll_req_wait/test/free (and coll_req_status, coll_req_cancel). buf must stay valid and
 * unchanged (unread) until the request completes. A send's request completes when coll_send
 * would have returned; its result is what coll_send would have returned (but a withdrawn
 * send is never a result: see coll_req_wait). Returns 0 and *req_p; COLL_EBADARG, COLL_EFORKED,
 * the communicator's failure, or -ENOMEM, with nothing started. */
int coll_isend(coll_comm_t *comm, const void *buf, size_t bytes, int dest, int tag, coll_req_t **req_p);
int coll_irecv(coll_comm_t *comm, void *buf, size_t bytes, int source, int tag, coll_req_t **req_p);

/* For a point-to-point request, coll_req_wait moves this rank's point-to-point operations along
 * while it waits (spinning briefly, then asleep in the kernel) and returns the operation's
 * result (0, COLL_EMISMATCH, the communicator's failure, COLL_EABORTED if the communicator was
 * freed first), or -ETIMEDOUT when timeout_s, or the communicator's timeout, ran out first: the
 * request goes on. coll_req_test makes one such step. coll_req_free of an unfinished receive
 * withdraws it if no message matched it yet, else (and for a send) waits for it first, and
 * the interrupt callback ends that wait: the operation is withdrawn (a send half way through
 * the channel in pieces cannot be, and fails the communicator). A rank's posted operations
 * also move while it is elsewhere (in a collective, computing): a helper thread, started at
 * its first point-to-point call, acts for it when a peer has waited for it a while. */

/* A completed receive's status: 0 and *status_p; COLL_EBADARG for NULL pointers, a request that
 * is not a receive, or one not finished yet. */
int coll_req_status(coll_req_t *req, coll_status_t *status_p);
/* Withdraw a receive no message has matched yet: 0, and it completes with -ECANCELED (nothing
 * lands in its buffer); -EBUSY when a message already matched it, or it is a send or a
 * collective (they cannot be withdrawn); -EALREADY when it has completed; COLL_EBADARG (NULL). */
int coll_req_cancel(coll_req_t *req);

/* The longest message a send hands over without waiting for its receiver (one cell of the
 * channel, less its header). */
#define COLL_P2P_EAGER_MAX 4032

/* The tree small collectives use when there are more than COLL_TREE_FANOUT ranks (and
 * with HBMCOLL_ALGO=<kind>=tree at any size): ranks ordered by pu (the first CPU each may run
 * on; < 0 unknown, after every known one; ties by rank); ranks with the same tile (an id of
 * the L2 their CPUs share, e.g. its first CPU; < 0 none) hang off the first of them, at most
 * COLL_TREE_FANOUT / 2 per tile. The tile leaders of one cluster (an id of the NUMA domain,
 * e.g. an SNC quadrant; all < 0 count as one) form a tree in pu order whose subtrees are runs
 * of neighbouring pus (the first leader heads the rest, cut into k even runs, each headed by
 * its first), k small enough that no rank has more than COLL_TREE_FANOUT children; the first
 * leaders of the clusters are joined the same way, with k / 2 children each. Pure: the same arguments give
 * the same tree on every rank (and in `coll-topo --tree`). Returns 0 and parent[0..n) (the
 * parent of each rank, -1 for the root); COLL_EBADARG (n < 1, a NULL pointer) or -ENOMEM,
 * parent untouched. */
#define COLL_TREE_FANOUT 8
int coll_tree_build(int n, const int *pu, const int *tile, const int *cluster, int *parent);

/* The HBMCOLL_* variables coll_comm_create reads, checked now (for callers that wait
 * before creating a communicator). Returns 0 and, if timeout_s_p, HBMCOLL_TIMEOUT's
 * seconds (0: no limit); or COLL_EBADARG and, in text (if text_len > 0), a sentence naming
 * the first malformed variable and the values it takes. */
int coll_env_check(double *timeout_s_p, char *text, size_t text_len);

/* Forced algorithm for a collective kind (also HBMCOLL_ALGO, e.g.
 * "allreduce=rsag,bcast=flat"): name, or NULL or "auto" for automatic choice.
 * Local, but every rank must force the same (a rank on another algorithm makes
 * the next collective of that kind return COLL_EMISMATCH). Returns 0, or
 * COLL_EBADARG (NULL comm, unknown kind, a name the kind does not have); the
 * setting is unchanged on failure. */
int coll_set_algorithm(coll_comm_t *comm, coll_kind_t kind, const char *name);
/* Static name ("allreduce", ...), "unknown" out of range. */
const char *coll_kind_name(coll_kind_t kind);

/* ---- the variables ------------------------------------------------------ */
/* Every HBMCOLL_* variable a user may set, whoever reads it: libcoll ("core"), the Python
 * package ("python"), the launcher, the layer across nodes ("nodes"), the memory servers'
 * clients ("memservers"), the torch backend ("torch"). Static strings, never NULL. */
typedef struct {
  const char *name;     /* "HBMCOLL_TIMEOUT" */
  const char *scope;    /* who reads it */
  const char *meaning;  /* one sentence, Markdown */
  const char *fallback; /* the default, in words */
} coll_variable_t;
/* The list, in docs/reference.md's order; *count_p (if not NULL) gets its length. */
const coll_variable_t *coll_variables(size_t *count_p);

#ifdef __cplusplus
}
#endif
#endif /* COLL_H */
