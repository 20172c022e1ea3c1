/*
 * transport_shm.c - the shared-memory transport inside a node: flags and descriptors in
 * the segment's control lines (sync.c waits on them), staging slots in the segment, single
 * copy through cross-memory attach (cma.c).
 */
#include "coll_internal.h"

static uint8_t *shm_slot(coll_comm_t *c, int rank, int parity) {
  return c->base + c->hdr->slot_off + ((size_t)rank * 2 + (size_t)parity) * c->hdr->slot_bytes;
}

static coll__desc_t *shm_desc(coll_comm_t *c, int rank, uint64_t seq) {
  return &c->ctl[rank].desc[seq & 1];
}

const coll__transport_t coll__shm_transport = {
    .name = "shm",
    .publish_arrive = coll__publish_arrive,
    .publish_done = coll__publish_done,
    .wait_arrive = coll__wait_arrive,
    .wait_done = coll__wait_done,
    .slot = shm_slot,
    .desc = shm_desc,
    .copy_peer = coll__cma_copy,
};
