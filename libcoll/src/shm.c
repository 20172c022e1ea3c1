/*
 * shm.c - the shared segment: an anonymous memfd, never a /dev/shm file, so
 * nothing is left behind when a job is killed and the 64 MB /dev/shm of a
 * container does not apply. Memory is charged to the memory cgroup as it is
 * touched; ftruncate only sets the size (sparse).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll_internal.h"

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
#define SHM_MASK_LONGS 16 /* NUMA nodes up to 1023 */
#define SHM_MPOL_F_ADDR (1 << 1) /* numaif.h's MPOL_F_ADDR, without libnuma */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int coll__segment_create(size_t bytes, int *fd_p) {
  int fd = (int)syscall(SYS_memfd_create, "hbmcoll", MFD_CLOEXEC);
  if (fd < 0) return -errno;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    int err = -errno;
    close(fd);
    return err;
  }
  *fd_p = fd;
  return 0;
}

int coll__segment_map(int fd, size_t bytes, uint8_t **base_p) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return -errno;
  *base_p = p;
  return 0;
}

/* Fault the pages in now so a full node shows up at creation as -ENOMEM with a sentence
 * naming the size and node(s), not as SIGBUS in the middle of a collective. Kernels without
 * MADV_POPULATE_WRITE (< 5.14) get every page touched instead, where a full node is SIGBUS. */
int coll__segment_prefault(void *addr, size_t bytes, char *err, size_t errlen) {
  if (bytes == 0 || madvise(addr, bytes, MADV_POPULATE_WRITE) == 0) return 0;
  int e = errno;
  if (e == EINVAL) { /* no MADV_POPULATE_WRITE */
    long page = sysconf(_SC_PAGESIZE);
    volatile uint8_t *p = addr;
    for (size_t off = 0; off < bytes; off += (size_t)page) p[off] = 0;
    return 0;
  }
  char nodes[64] = "the default policy's node";
  unsigned cpu = 0, node = 0;
  if (getcpu(&cpu, &node) == 0) /* the default policy takes the faulting CPU's node */
    snprintf(nodes, sizeof nodes, "node %u (the default policy: this CPU's node)", node);
  int mode = 0;
  unsigned long mask[SHM_MASK_LONGS] = {0};
  if (syscall(SYS_get_mempolicy, &mode, mask, (unsigned long)SHM_MASK_LONGS * 64, addr,
              (unsigned long)SHM_MPOL_F_ADDR) == 0 && mode != 0) {
    size_t n = (size_t)snprintf(nodes, sizeof nodes, "node");
    for (int i = 0; i < SHM_MASK_LONGS * 64 && n + 8 < sizeof nodes; i++)
      if (mask[i / 64] >> (i % 64) & 1) n += (size_t)snprintf(nodes + n, sizeof nodes - n, " %d", i);
  }
  snprintf(err, errlen, "out of memory: the shared segment's %.1f MiB of control and staging "
           "memory do not fit on %s (%s); free memory there, or lower HBMCOLL_SLOT_BYTES",
           (double)bytes / (1024.0 * 1024.0), nodes,
           e == EFAULT || e == EHWPOISON ? "the kernel could not provide the pages" : strerror(e));
  return e == EFAULT || e == EHWPOISON ? -ENOMEM : -e;
}
