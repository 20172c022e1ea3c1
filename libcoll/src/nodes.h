/*
 * nodes.h - a job that spans nodes, from C: the communicator over the node's communicator and the
 * bridge (nodes_comm.c), the rendezvous of the nodes (nodes_meet.c, authenticated with
 * nodes_sha256.c), the connections that notice a lost node (nodes_watch.c), who is where and the
 * rings (nodes_join.c), and the launcher's variables (nodes_env.c). The Python package joins
 * through coll__nodes_join too (pymod/join.c), with the meeting point it reads itself (it may
 * draw the secret through torchrun's store, or pick the ports of a group). A split of such a
 * communicator is one too (nodes_split.c).
 */
#ifndef COLL_NODES_H
#define COLL_NODES_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "coll.h"
#include "hier.h"
#include "net.h"
#include "net_ring.h"

#define COLL__NODES_TEXT 320 /* the sentences of this layer (they name addresses and nodes) */

/* ---- nodes_sha256.c ---- */
#define COLL__SHA256_BYTES 32
/* HMAC-SHA256 (RFC 2104) of the concatenation of n parts under key. */
void coll__hmac_sha256(const uint8_t *key, size_t key_len, const void *const *parts, const size_t *lens, int n,
                       uint8_t out[COLL__SHA256_BYTES]);
void coll__sha256(const void *data, size_t len, uint8_t out[COLL__SHA256_BYTES]);

/* ---- nodes_watch.c: the connections that stay open after the rendezvous ---- */
typedef struct coll__nodes_watch coll__nodes_watch_t;
/* Takes the connected sockets (member 0: one per other member; member k: the one to member 0).
 * Returns 0 and *w_p, or -errno (the sockets are closed either way). */
int coll__nodes_watch_start(const int *socks, int n, int relay, coll__nodes_watch_t **w_p);
/* The fd a failure shuts (hier.c) and the bridge watches (net.h): end of file once the job's
 * communicator can no longer go on. */
int coll__nodes_watch_fd(const coll__nodes_watch_t *w);
/* fn(arg) is called from the watch's thread every 100 ms of quiet (NULL: no more calls; once this
 * returns, none is under way): it ends the communicator when it finds a rank of this node dead. */
void coll__nodes_watch_guard(coll__nodes_watch_t *w, int (*fn)(void *), void *arg);
/* 1 and the sentence when a member left before the call this rank is in (what a lost peer in it
 * means then), else 0. */
int coll__nodes_watch_why(coll__nodes_watch_t *w, char *err, size_t errlen);
/* A call begins: 0, or COLL_EPEERLOST with a sentence when a member left before this call. */
int coll__nodes_watch_began(coll__nodes_watch_t *w, char *err, size_t errlen);
/* Collective: goodbye, and wait (at most timeout_s) for every member's; then close. */
void coll__nodes_watch_close(coll__nodes_watch_t *w, double timeout_s);
/* This member failed: close without goodbye (the others' watches fire). NULL is fine. */
void coll__nodes_watch_abort(coll__nodes_watch_t *w);

/* ---- nodes_meet.c: the rendezvous (HMAC proofs, then every member's blob) ---- */
typedef struct {
  int member;          /* the member's number (any unique int; the listener is 0) */
  uint8_t *blob;       /* its blob */
  size_t len;
} coll__nodes_blob_t;
/* complete(arg, blobs, n, text, len) says, as members come, whether all came (1), not yet (0), or
 * that the job cannot go on (< 0: text is every member's error); who(arg, blobs, n, text, len) says
 * who came and who is missing. */
typedef struct {
  int (*complete)(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len);
  void (*who)(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len);
  void *arg;
  coll_warn_fn warn; /* the line said after 10 s (NULL: stderr) */
  void *warn_arg;
  coll_interrupt_fn interrupt; /* checked while waiting */
  void *interrupt_arg;
  int listener; /* member 0: a socket the caller listens on already (duplicated: the caller closes
                 * its own, which is nonblocking from then on), or 0: listen at addr:port (the Python
                 * package's groups pick their ports this way) */
} coll__nodes_meet_t;
/* Member `me` meets the others at addr:port (me == 0 listens there) with secret; its blob goes
 * to everyone. Returns 0, *blobs_p (sorted by member, blob buffers owned by the array: free with
 * coll__nodes_blobs_free) and *n_p, and *watch_p; or COLL_EBOOTSTRAP, -ETIMEDOUT (with the
 * sentence naming the address and port), COLL_EINTERRUPTED, -ENOMEM with a sentence in err. */
int coll__nodes_meet(int me, const char *addr, int port, const char *secret, const uint8_t *blob, size_t len,
                     const coll__nodes_meet_t *how, double timeout_s, coll__nodes_blob_t **blobs_p, int *n_p,
                     coll__nodes_watch_t **watch_p, char *err, size_t errlen);
void coll__nodes_blobs_free(coll__nodes_blob_t *blobs, int n);
/* The complete() and who() of a rendezvous of members 0..n-1 (arg: an int *n). */
int coll__nodes_members_complete(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len);
void coll__nodes_members_who(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len);

/* ---- nodes_comm.c: the communicator that spans nodes ---- */
typedef struct {
  coll_comm_t *local;         /* this node's ranks (local rank = its rank there) */
  coll__net_t *net;           /* this rank's bridge endpoint, NULL if it carries no ring */
  coll__net_ring_t *ring;     /* its ring (NULL with one node, or without endpoint) */
  coll__nodes_watch_t *watch; /* the connections of its rendezvous, NULL none */
  int nodes, node, rings, size;
  const int *node_of, *local_of; /* [size] */
  double timeout_s;
  const char *iface;          /* the bridge's interface (NULL: the provider's first), for splits */
  int family;                 /* the job's address family (net.h), for splits */
  size_t pool_bytes;          /* each endpoint's pool (0: COLL__NODES_POOL), for splits */
  const coll_comm_t *parent;  /* a split's: its watched connection is shared (a duplicate of its
                               * fd), so a failure in either ends both; NULL for the job's own */
} coll__span_config_t;
/* The job's communicator over these parts, which it takes in every case (freed on failure too).
 * Returns 0 and *comm_p, or COLL_EBADARG (a layout that does not add up) / -ENOMEM with a
 * sentence in err. */
int coll__comm_span(const coll__span_config_t *cfg, coll_comm_t **comm_p, char *err, size_t errlen);
/* A communicator that holds only a failure (coll_comm_error reads it), for creators that must
 * hand one back. NULL when out of memory. */
coll_comm_t *coll__comm_failed(int rank, int size, int code, const char *text);

/* The public functions' branches for a spanning communicator (c->span != NULL). */
int coll__span_split(coll_comm_t *c, int color, int key, coll_comm_t **comm_p); /* nodes_split.c */
/* What a split takes from its parent. */
const char *coll__span_iface(const coll_comm_t *c);
int coll__span_family(const coll_comm_t *c);
size_t coll__span_pool_bytes(const coll_comm_t *c);
double coll__span_timeout(const coll_comm_t *c);
int coll__span_node_index(const coll_comm_t *c);
/* Who is where, for the Python package: this node's number, the nodes, the rings, and for each
 * rank its node and its rank there ([size] each, the communicator's own); the bridge's line. */
void coll__span_layout(const coll_comm_t *c, int *node_p, int *nodes_p, int *rings_p, const int **node_of_p,
                       const int **local_of_p);
const char *coll__span_describe(const coll_comm_t *c);
/* Ends c on every rank of every node with this sentence (the layer's failure, hier.c). */
void coll__span_fail(coll_comm_t *c, int code, const char *text);
/* What the point-to-point calls take from it (nodes_p2p.c). */
typedef struct coll__span_p2p coll__span_p2p_t;
coll__span_p2p_t *coll__span_p2p(const coll_comm_t *c);
int coll__span_watch(const coll_comm_t *c);                /* the fd that closes on a failure, -1 none */
int coll__span_local_of(const coll_comm_t *c, int rank); /* its rank on this node, -1 on another */
void coll__span_note(coll_comm_t *c, const char *text);  /* the sentence coll_comm_error says next */
int coll__span_run(coll_comm_t *c, const coll_args_t *a);
int coll__span_start(coll_comm_t *c, const coll_args_t *a, coll_req_t **req_p);
int coll__span_settle(coll_comm_t *c);
void coll__span_free(coll_comm_t *c);
/* coll__span_free, collective goodbye included, but the node's communicator is handed back (its
 * arena still holds the caller's arrays: pymod's hbmcoll.empty), to free later. */
coll_comm_t *coll__span_free_but_node(coll_comm_t *c);
void coll__span_leave(coll_comm_t *c);
void coll__span_abort(coll_comm_t *c, int reason);
int coll__span_error(const coll_comm_t *c, const char **text_p);
void coll__span_keep_text(coll_comm_t *c, const char *text); /* coll__keep_text's */
const char *coll__span_algorithm(const coll_comm_t *c);
void coll__span_set_interrupt(coll_comm_t *c, coll_interrupt_fn fn, void *arg);

/* ---- nodes_p2p.c: point-to-point across nodes (coll.h's calls on a spanning communicator) ---- */
/* Collective over c, once made: every rank's endpoint and card. 0 and *p_p (which may hold only
 * why point-to-point is unavailable), or the allgather's failure with a sentence. */
int coll__span_p2p_open(coll_comm_t *c, coll__span_p2p_t **p_p, char *err, size_t errlen);
void coll__span_p2p_close(coll__span_p2p_t *p); /* NULL is fine; pending requests end */
int coll__span_send(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag);
int coll__span_recv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_status_t *status_p);
int coll__span_isend(coll_comm_t *c, const void *buf, size_t bytes, int dest, int tag, coll_req_t **req_p);
int coll__span_irecv(coll_comm_t *c, void *buf, size_t bytes, int source, int tag, coll_req_t **req_p);

/* ---- nodes_join.c: who is where, the rings ---- */
typedef struct {
  int rank, size;           /* in the job */
  const char *name;         /* this node's name (HBMCOLL_NODE, else the hostname) */
  const char *secret;       /* the job's secret (HBMCOLL_JOB_KEY) */
  const char *addr;         /* the rendezvous' address (node of rank 0) */
  int port;                 /* ring l meets at port + l */
  const char *iface;        /* the bridge's interface */
  int family;               /* of addr: AF_INET6 takes iface's IPv6 address, else IPv4 */
  double timeout_s;         /* the rendezvous' limit (<= 0: none) */
  double wait_s;            /* every wait's afterwards (<= 0: none) */
  size_t pool_bytes;        /* each endpoint's registered pool (0: 4 MiB) */
  const int *ports;         /* NULL, or ring l's port for l < nports (instead of port + l) */
  int nports;
  int listener;             /* a socket this rank listens on already for its ring's rendezvous, or 0 */
  coll_comm_t **node_back;  /* NULL, or where the node's communicator goes back on a failure every
                             * local rank shares (local rank 0's at the rendezvous), instead of freed */
} coll__nodes_join_t;
/* Ring `me` of n members over endpoint net from the members' cards (every member reached, for the
 * small allgather). 0 and *ring_p, or a failure with a sentence in err. */
int coll__nodes_ring(coll__net_t *net, int n, int me, coll__nodes_blob_t *cards, coll__net_ring_t **ring_p,
                     char *err, size_t errlen);
/* This rank's endpoint, its pool in node's arena where it fits (else its own). */
int coll__nodes_open(coll_comm_t *node, const char *iface, int family, size_t pool_bytes, coll__net_t **net_p,
                     char *err, size_t errlen);
/* Collective over the node's communicator `node` (taken: freed on failure too, but see node_back): the nodes meet,
 * check the layout, build the rings. Returns 0 and *comm_p, or a failure with a sentence in err
 * that names the address, port and node where it applies. */
int coll__nodes_join(coll_comm_t *node, const coll__nodes_join_t *cfg, coll_comm_t **comm_p, char *err,
                     size_t errlen);
#define COLL__NODES_PROTOCOL 4 /* what the C nodes say to each other; raised at every change */
#define COLL__NODES_KEY_MIN 16 /* characters of a job's secret across nodes: fewer could be guessed */
#define COLL__NODES_POOL (4u << 20)

/* ---- nodes_env.c: the launcher's variables ---- */
typedef struct {
  int rank, size, local_rank, local_size;
  const char *launcher;  /* "hbmcoll-run", "torchrun", "mpiexec", "srun", "single" */
  char key[256];         /* HBMCOLL_JOB_KEY */
  char addr[256];        /* across nodes: HBMCOLL_MASTER / MASTER_ADDR / srun's first node */
  int port;              /* ring 0's rendezvous port */
  int family;            /* addr's: AF_INET6 for an IPv6 address or a name with only those */
  char iface[64];        /* HBMCOLL_IFACE, else the interface toward addr */
  char name[256];        /* HBMCOLL_NODE, else the hostname */
} coll__job_env_t;
/* The launcher's rank, sizes and key; across nodes also the meeting point. 0, or COLL_EBADARG
 * with a sentence naming the variable. */
int coll__job_env(coll__job_env_t *env, char *err, size_t errlen);
/* Interface name's address of family (AF_INET6: one that is not link-local) as text into out
 * ("" when it has none). */
void coll__iface_address(const char *name, int family, char *out, size_t len);
/* addr (a name or a literal address of either family) resolved for port into *sa_p and *len_p,
 * IPv4 where it has one (so IPv4 jobs stay as they were), else IPv6: 0, or getaddrinfo's code. */
int coll__addr_resolve(const char *addr, int port, struct sockaddr_storage *sa_p, socklen_t *len_p);
/* "A:P", or "[A]:P" for an IPv6 address A, into out (for messages). */
void coll__addr_join(const char *addr, int port, char *out, size_t len);

#endif /* COLL_NODES_H */
