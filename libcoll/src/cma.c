/*
 * cma.c - single copy between two ranks' private buffers with Linux
 * cross-memory attach (process_vm_readv / process_vm_writev).
 *
 * Staging moves a large message twice (into a slot, out of it); when the
 * kernel lets one process read or write another's memory, a receiver can
 * pull straight from the root's NumPy array instead, which halves the memory
 * traffic of a large bcast and lets the senders of a gather write into the
 * root's output while the root copies its own part.
 *
 * HBMCOLL_CMA=1 asks for it in bcast and gather (=gather, =bcast: that one only); "auto", the
 * default, in gather unless a probe at creation finds staging faster (cma_probe.c); python -m
 * hbmcoll.tune measures which pays on the host. On the VMs first measured it lost to staging
 * (bench/README.md, "Measurements behind the code"): the kernel pins and
 * maps every 4 KiB page of the peer, which costs more than the second copy
 * through cache-resident slots; only with the cores taken by other work
 * did it win (staging needs both ranks on a CPU at once). On later VMs it won gathers from
 * 256 KiB. Bare-metal nodes, where MPICH and Open MPI use it from 8 KiB, may differ: measure
 * with `make bench-c ARGS="-c bcast -s 16777216"` and HBMCOLL_CMA=0/1.
 *
 * Whether it works is decided once per communicator, identically on every
 * rank: at creation each rank reads a probe word from every peer (the word's
 * address and value are in the peer's control line), writes the same value
 * back, and says whether all reads gave the right value and all writes went;
 * the communicator uses single copy only if all ranks say yes. It fails, and staging stays, when ranks sit in different PID
 * namespaces (a pid would name another process), under Yama ptrace_scope >= 1
 * without a ptracer relationship, under a seccomp profile that refuses the
 * calls, or with HBMCOLL_CMA=0 on any rank. Many readers of one process contend
 * inside the kernel (page pinning; Chakraborty et al., Cluster 2017), so the
 * algorithms use it only up to COLL_CMA_MAX_RANKS ranks.
 */
#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "coll_internal.h"
#include "nodes.h"

void coll__cma_publish_probe(coll_comm_t *c) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  c->cma_probe = ((uint64_t)getpid() << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)c;
  coll__ctl_t *me = &c->ctl[c->rank];
  me->cma_addr = (uint64_t)(uintptr_t)&c->cma_probe;
  me->cma_value = c->cma_probe;
}

/* Whether this rank can read every peer's probe word (published before a barrier): the peers
 * in its pid namespace, each read back with process_vm_readv. */
int coll__cma_reads_peers(const coll_comm_t *c) {
  const coll__ctl_t *me = &c->ctl[c->rank];
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank) continue;
    const coll__ctl_t *peer = &c->ctl[q];
    if (peer->pidns == 0 || peer->pidns != me->pidns) return 0;
    uint64_t got = 0;
    struct iovec local = {&got, sizeof got};
    struct iovec remote = {(void *)(uintptr_t)peer->cma_addr, sizeof got};
    if (process_vm_readv(peer->pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof got || got != peer->cma_value)
      return 0;
  }
  return 1;
}

/* Whether this rank can also write every peer (a gather's senders write the root's output): each
 * probe word is written back with the value it holds, so a peer reading it meanwhile sees no
 * change. A policy may allow one call and refuse the other. */
static int cma_writes_peers(const coll_comm_t *c) {
  for (int q = 0; q < c->size; q++) {
    if (q == c->rank) continue;
    const coll__ctl_t *peer = &c->ctl[q];
    uint64_t same = peer->cma_value;
    struct iovec local = {&same, sizeof same};
    struct iovec remote = {(void *)(uintptr_t)peer->cma_addr, sizeof same};
    if (process_vm_writev(peer->pid, &local, 1, &remote, 1, 0) != (ssize_t)sizeof same) return 0;
  }
  return 1;
}

/* After a barrier that follows every rank's coll__cma_publish_probe. */
void coll__cma_check_peers(coll_comm_t *c) {
  int ok = c->params.cma && c->size <= COLL_CMA_MAX_RANKS && coll__cma_reads_peers(c) && cma_writes_peers(c);
  c->ctl[c->rank].cma_ok = ok ? 1 : 2;
}

/* After a second barrier: the verdict of all ranks. */
void coll__cma_agree(coll_comm_t *c) {
  c->cma = 1;
  for (int q = 0; q < c->size; q++)
    if (c->ctl[q].cma_ok != 1) c->cma = 0;
}

int coll_comm_single_copy(const coll_comm_t *c) { return c && c->cma ? (int)c->hdr->cma_kinds : 0; }

const char *coll_comm_algorithm(const coll_comm_t *c) {
  if (c && c->span) return coll__span_algorithm(c);
  return c && c->algorithm ? c->algorithm : "";
}

/* Copies n bytes between my `local` and `remote` in rank `peer` (write: to
 * the peer). A failure here is unexpected (the probe worked), most likely the
 * peer died: the communicator fails on every rank. */
int coll__cma_copy(coll_comm_t *c, int peer, void *local, uint64_t remote, size_t n, int write) {
  uint8_t *l = local;
  while (n > 0) {
    struct iovec li = {l, n}, ri = {(void *)(uintptr_t)remote, n};
    ssize_t got = write ? process_vm_writev(c->ctl[peer].pid, &li, 1, &ri, 1, 0)
                        : process_vm_readv(c->ctl[peer].pid, &li, 1, &ri, 1, 0);
    if (got <= 0) {
      int e = got < 0 ? errno : EIO;
      if (e == EINTR) continue;
      return coll__fail(c, e == ESRCH ? COLL_EPEERLOST : -e,
                        "single-copy %s rank %d (pid %d) failed: %s", write ? "write to" : "read from",
                        peer, (int)c->ctl[peer].pid, strerror(e));
    }
    l += got;
    remote += (uint64_t)got;
    n -= (size_t)got;
  }
  return 0;
}
