/*
 * shm.c - the shared segment: an anonymous memfd, never a /dev/shm file, so
 * nothing is left behind when a job is killed and the 64 MB /dev/shm of a
 * container does not apply. Memory is charged to the memory cgroup as it is
 * touched; ftruncate only sets the size (sparse).
 */
#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "coll_internal.h"

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001U
#endif
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

/* Fault the pages in now so a full node shows up at creation, not as SIGBUS
 * in the middle of a collective. Falls back to touching every page on kernels
 * without MADV_POPULATE_WRITE (< 5.14). */
void coll__segment_prefault(void *addr, size_t bytes) {
  if (bytes == 0) return;
  if (madvise(addr, bytes, MADV_POPULATE_WRITE) == 0) return;
  long page = sysconf(_SC_PAGESIZE);
  volatile uint8_t *p = addr;
  for (size_t off = 0; off < bytes; off += (size_t)page) p[off] = 0;
}
