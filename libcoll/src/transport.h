/*
 * transport.h - what moves signals and bytes between ranks, behind one small table.
 *
 * The round layer (round.c) is written against these operations only; the algorithms
 * against the round layer. Shared memory inside a node is the first transport
 * (transport_shm.c: flags in the segment's control lines, staging slots in the segment,
 * single copy through cross-memory attach). A network bridge is the next: it implements
 * the same table over its own buffers, and hierarchical collectives compose the two.
 *
 * A transport keeps, for every rank, two counters that only grow: `arrive` (the rank's
 * data for round t is in place) and `done` (it finished reading what others published for
 * round t); two staging slots per rank (by round parity); and each rank's descriptor of
 * the collective it is in.
 */
#ifndef COLL_TRANSPORT_H
#define COLL_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "coll.h"

typedef struct coll__desc coll__desc_t;

typedef struct coll__transport {
  const char *name;
  /* Set my arrive (done) counter to `round` and wake whoever waits on it. */
  void (*publish_arrive)(coll_comm_t *c, uint64_t round);
  void (*publish_done)(coll_comm_t *c, uint64_t round);
  /* Until peer's arrive (done) counter reaches `round`: 0, or the communicator's failure
   * code (a dead peer, Ctrl-C, the deadline, an abort by any rank). */
  int (*wait_arrive)(coll_comm_t *c, int peer, uint64_t round);
  int (*wait_done)(coll_comm_t *c, int peer, uint64_t round);
  /* Staging slot `parity` of `rank` (mine to write, a peer's to read). */
  uint8_t *(*slot)(coll_comm_t *c, int rank, int parity);
  /* Descriptor of `rank` for collective number `seq` (mine to write). */
  coll__desc_t *(*desc)(coll_comm_t *c, int rank, uint64_t seq);
  /* Copy n bytes between my `local` buffer and address `remote` in peer's process (write:
   * local -> remote). 0, or a failure code (the communicator is failed). */
  int (*copy_peer)(coll_comm_t *c, int peer, void *local, uint64_t remote, size_t n, int write);
} coll__transport_t;

extern const coll__transport_t coll__shm_transport;

#endif /* COLL_TRANSPORT_H */
