/*
 * hier.h - the collectives of a job that spans nodes: this node's communicator (shared memory,
 * coll_run) composed with the rings of the bridge between the nodes (net_ring.h), in C from the
 * call's arguments to its result.
 *
 * Two moves between nodes carry every collective, each split over the node's ring carriers
 * (local ranks 0..R-1, R the fewest ranks of any node), so every carrier and a NIC queue each
 * work at once:
 * - reduce across (hier_allreduce.c): the node's result (on every local rank) is cut in R
 *   slices; carrier l reduces slice l around ring l; a local allgather brings the slices back.
 *   Each element is reduced in the same order on every rank, so every rank gets the same bits.
 * - gather across (hier_gather.c): the node's block of bytes (the same on every local rank) is
 *   cut in R slices; carrier l gathers slice l of every node around ring l; a local allgather
 *   brings them to every local rank.
 * Every call starts with the meeting (hier.c): a block of a fixed size from every rank, its
 * descriptor and up to `ride` bytes of data, gathered in the node and then between the nodes.
 * Every rank sees every node's block, so every rank reaches the same verdict: a disagreement
 * anywhere is COLL_EMISMATCH on every rank, and the communicator stays usable. Allreduce, bcast
 * and barrier of up to `ride` bytes finish in the meeting, and so does allgather (and gather)
 * with one rank per node. `ride` is COLL__HIER_SMALL, or with two nodes of one rank each (no
 * node stage, and one step between the nodes that moves only the call's bytes) up to
 * COLL__HIER_RIDE_2 as the ring's eager path allows.
 */
#ifndef COLL_HIER_H
#define COLL_HIER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "coll.h"
#include "net_ring.h"

#define COLL__HIER_SMALL 1024   /* bytes of data that ride with every call's descriptor */
#define COLL__HIER_RIDE_2 65536 /* the most that rides between two nodes of one rank each */

typedef struct coll__hier coll__hier_t;

typedef struct {
  coll_comm_t *local;     /* this node's ranks; local rank = its rank there */
  coll__net_ring_t *ring; /* the ring this rank carries (local rank < rings), else NULL; NULL
                           * on every rank when there is one node */
  int nodes, node;        /* how many, and this rank's */
  int rings;              /* R: the carriers per node (the fewest ranks of any node) */
  int size;               /* ranks of the job */
  const int *node_of;     /* [size]: each rank's node ... */
  const int *local_of;    /* ... and its local rank there (ranks of a node numbered in order) */
  double timeout_s;       /* bounds each wait for another node (<= 0: none) */
  int watch_fd;           /* a connection to the other nodes, shut when a call fails (-1: none) */
} coll__hier_config_t;

/* Local. Returns 0 and *h_p; COLL_EBADARG (a layout that does not add up) with a sentence in
 * err, or -ENOMEM. The communicator and ring stay
 * the caller's: free them after coll__hier_free. */
int coll__hier_make(const coll__hier_config_t *cfg, coll__hier_t **h_p, char *err, size_t errlen);
void coll__hier_free(coll__hier_t *h); /* NULL is fine */
int coll__hier_rank(const coll__hier_t *h);

/* The collective a (shapes as coll_run's, with the job's size; COLL_AVG for every dtype, as on
 * one node), on every rank of every node at once. Returns 0; COLL_EMISMATCH (ranks disagree:
 * nothing else happened, the next call may follow); or a failure of the node's communicator or
 * of the ring (a lost node, -ETIMEDOUT, COLL_EINTERRUPTED), after which the caller must end the
 * job's communicator. err gets a sentence for every failure. */
int coll__hier_run(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen);
/* The same, queued on the layer's request engine (coll_req_wait/test/free; a blocking call made
 * while requests are queued must wait behind them: coll__hier_pending says how many there are).
 * Any failure but COLL_EMISMATCH and COLL_EBADARG ends the job's communicator: the node's
 * communicator fails with the reason and its text (so its ranks, and a request's waiter, read
 * it), the watched connection is shut (the other nodes' waits end), and later calls return it. */
int coll__hier_start(coll__hier_t *h, const coll_args_t *a, coll_req_t **req_p, char *err, size_t errlen);
int coll__hier_pending(coll__hier_t *h);
/* End the job's communicator from here (Ctrl-C in a waiter, an abort): code and text as above. */
void coll__hier_fail(coll__hier_t *h, int code, const char *text);
/* The failure that ended it (0: none) and its sentence. */
int coll__hier_failure(coll__hier_t *h, const char **text_p);
/* Only the meeting of coll__hier_run (for a collective composed by the caller). */
int coll__hier_agree(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen);
/* The path the last call took ("meeting", "sliced", "rings", "gather"), for timelines. */
const char *coll__hier_algorithm(const coll__hier_t *h);

/* ---- between the files of the layer ---- */
struct coll__hier {
  coll__hier_config_t cfg;
  struct coll__worker *worker; /* the request engine (request.c), started on first use */
  _Atomic int failed;          /* the failure that ended the job's communicator, 0 none */
  char fail_text[320];
  int *node_of, *local_of; /* copies of the config's */
  int *rank_at;            /* [node * widest + local]: the rank there, -1 none */
  int rank, local_rank, local_size, widest;
  int even;      /* every node has exactly `rings` ranks */
  int rank_is_node; /* one rank per node, rank k on node k: an allgather's ring rows are its result */
  int sliced;    /* even and rings > 1: the pipelined allreduce */
  uint8_t hint;  /* node 0's local rank 0's proposal in the last meeting: the chunk count */
  size_t ride, stride; /* the data bytes that ride in a meeting block, and the block's size */
  const char *algorithm;
  uint8_t *block, *rows, *blocks; /* the meeting's: mine, my node's, every node's */
  uint8_t *scratch[7];            /* grown on demand, kept for the next call (HIER_SCR_*) */
  size_t scratch_bytes[7];
  const void **inputs;            /* max(local size, nodes) pointers, for folds */
  /* the chunk count of the pipelined allreduce, chosen from the first calls' times (hier_allreduce.c) */
  int fixed_chunks;      /* HBMCOLL_PIPELINE_CHUNKS, 0 unset */
  struct { double times[4][3]; int tried[4]; int chosen; } tune[64]; /* by bit length of a piece */
};

/* What a node contributes to the meeting's data besides its head. */
typedef enum { HIER_PART_NONE, HIER_PART_FOLD, HIER_PART_PICK } coll__hier_part_t;
/* The meeting: my data (NULL: none) of len bytes, the node's part of len bytes made as `part`
says (pick: the local rank whose data), and *parts_p gets every node's (nodes rows, h->stride
apart; of each, len bytes are the node's). len <= h->ride. */
int coll__hier_meet(coll__hier_t *h, const coll_args_t *a, const void *data, size_t len,
                    coll__hier_part_t part, int pick, uint8_t hint, const uint8_t **parts_p, char *err,
                    size_t errlen);
/* Scratch buffers: the moves' (piece, every), the collectives' (mine, all), the call's, the
 * gathered blocks' (out), an in-place call's copy of its input (copy). coll__hier_scratch: `which`, of at least bytes (NULL: no memory). */
enum { HIER_SCR_PIECE, HIER_SCR_EVERY, HIER_SCR_MINE, HIER_SCR_ALL, HIER_SCR_CALL, HIER_SCR_OUT, HIER_SCR_COPY };
void *coll__hier_scratch(coll__hier_t *h, int which, size_t bytes);
/* A failure of the node's communicator (rc) with its sentence in err. */
int coll__hier_local_failed(coll__hier_t *h, int rc, char *err, size_t errlen);
/* coll_run on the node's communicator, moving bytes (uint8) or reducing. */
int coll__hier_local(coll__hier_t *h, coll_kind_t kind, coll_dtype_t dtype, coll_op_t op, int root,
                     size_t count, const void *send, void *recv, char *err, size_t errlen);

/* hier_allreduce.c */
/* The chunk count: this rank's proposal for a call whose pieces are `piece` bytes (0: not the
 * proposer, node 0's local rank 0), and the time a call with `chunks` took. */
#define HIER_MIN_PIECE (64u << 10) /* no chunk's piece smaller: each ring call costs steps */
#define HIER_TRIES 3               /* calls per candidate before the choice */
int coll__hier_propose(coll__hier_t *h, size_t piece);
void coll__hier_took(coll__hier_t *h, size_t piece, int chunks, double seconds);
int coll__hier_reduce_across(coll__hier_t *h, void *buf, size_t count, coll_dtype_t dtype, coll_op_t op,
                             char *err, size_t errlen);
/* Node `node`'s bytes buf[0..bytes) (the same on its every rank) to every rank of every node. */
int coll__hier_bcast_across(coll__hier_t *h, void *buf, size_t bytes, int node, char *err, size_t errlen);
/* a's allreduce (or reduce: a->kind is what the meeting compares) with the result in out. */
int coll__hier_allreduce(coll__hier_t *h, const coll_args_t *a, void *out, char *err, size_t errlen);
/* After a meeting: send[0..count) reduced over every rank into out (either path, no meeting). */
int coll__hier_allreduce_met(coll__hier_t *h, const void *send, void *out, size_t count, coll_dtype_t dtype,
                             coll_op_t op, char *err, size_t errlen);
/* hier_gather.c */
int coll__hier_gather_across(coll__hier_t *h, const uint8_t *raw, size_t bytes, uint8_t *every, char *err,
                             size_t errlen);
int coll__hier_allgather(coll__hier_t *h, const coll_args_t *a, void *out, char *err, size_t errlen);
int coll__hier_reduce_scatter(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen);
int coll__hier_alltoall(coll__hier_t *h, const coll_args_t *a, char *err, size_t errlen);

#endif /* COLL_HIER_H */
