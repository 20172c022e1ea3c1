/*
 * transport_shm.c - the shared-memory transport inside a node: flags and descriptors in
 * the segment's control lines (sync.c waits on them), staging slots in the segment, single
 * copy through cross-memory attach (cma.c).
 */
#include "coll_internal.h"

static void shm_publish(coll_comm_t *c, coll__flag_t flag, uint64_t round) {
  if (flag == COLL_FLAG_ARRIVE) coll__publish_arrive(c, round);
  else coll__publish_done(c, round);
}

static int shm_wait(coll_comm_t *c, int peer, coll__flag_t flag, uint64_t round) {
  return flag == COLL_FLAG_ARRIVE ? coll__wait_arrive(c, peer, round) : coll__wait_done(c, peer, round);
}

static uint8_t *shm_slot(coll_comm_t *c, int rank, int parity) {
  return c->base + c->hdr->slot_off + ((size_t)rank * 2 + (size_t)parity) * c->hdr->slot_bytes;
}

static coll__desc_t *shm_desc(coll_comm_t *c, int rank, uint64_t seq) {
  return &c->ctl[rank].desc[seq & 1];
}

const coll__transport_t coll__shm_transport = {
    .name = "shm",
    .publish = shm_publish,
    .wait = shm_wait,
    .slot = shm_slot,
    .desc = shm_desc,
    .copy_peer = coll__cma_copy,
};
