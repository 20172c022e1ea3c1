/*
 * scratch.c - private per-rank memory near the rank: coll_numa_scratch_alloc().
 *
 * Where memkind sees HBW memory, buffers come from its HBW kinds (never a
 * strict bind: an overflow would be an OOM kill); otherwise from an anonymous
 * mapping placed like a segment (apply.c). memkind is opened with dlopen at the
 * first allocation, not linked: a process that never asks for scratch memory
 * (most of them) never loads it, and a machine without libmemkind still
 * works, on the mbind path, with one note saying so. memkind picks its node
 * from the CPU the caller runs on, so the choice is made after setup pinned
 * this process.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <numaif.h>

#include "numa_internal.h"

enum { SCRATCH_UNCHOSEN = 0, SCRATCH_MEMKIND = 1, SCRATCH_MMAP = 2, SCRATCH_PLAIN = 3 };
#define SCRATCH_MEMKIND_SUCCESS 0 /* memkind.h's MEMKIND_SUCCESS */

/* The few memkind entry points used, resolved once per process. */
static struct {
  int tried;
  void *lib;
  int (*check_available)(void *kind);
  int (*posix_memalign)(void *kind, void **p, size_t align, size_t size);
  void (*free)(void *kind, void *p);
  void **hbw_preferred, **hbw_interleave; /* memkind's kind variables */
} scratch_mk;

static int scratch_load_memkind(void) {
  if (scratch_mk.tried)
    return scratch_mk.lib != NULL;
  scratch_mk.tried = 1;
  void *lib = dlopen("libmemkind.so.0", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL)
    return 0;
  *(void **)&scratch_mk.check_available = dlsym(lib, "memkind_check_available");
  *(void **)&scratch_mk.posix_memalign = dlsym(lib, "memkind_posix_memalign");
  *(void **)&scratch_mk.free = dlsym(lib, "memkind_free");
  scratch_mk.hbw_preferred = dlsym(lib, "MEMKIND_HBW_PREFERRED");
  scratch_mk.hbw_interleave = dlsym(lib, "MEMKIND_HBW_INTERLEAVE");
  if (!scratch_mk.check_available || !scratch_mk.posix_memalign || !scratch_mk.free ||
      !scratch_mk.hbw_preferred || !scratch_mk.hbw_interleave) {
    dlclose(lib);
    return 0;
  }
  scratch_mk.lib = lib;
  return 1;
}

/* DDR: a plain mapping, first touched near the pinned CPU. HBM: memkind where it sees
 * HBM on this machine, after pinning; else mmap + mbind. */
static void scratch_choose(coll_numa_ctx_t *ctx) {
  int effective = ctx->plan->effective;
  int hbm = effective == COLL_NUMA_MEM_HBM_INTERLEAVE || effective == COLL_NUMA_MEM_HBM_BIND ||
            effective == COLL_NUMA_MEM_HBM_PREFERRED;
  ctx->scratch_way_ = hbm ? SCRATCH_MMAP : SCRATCH_PLAIN;
  /* memkind would look at this machine, not at a foreign topology */
  if (!hbm || !ctx->mbind_ok || !ctx->topo->thissystem)
    return;
  if (!scratch_load_memkind()) {
    coll__numa_addnote(ctx->notes, sizeof(ctx->notes),
                       "libmemkind.so.0 is not installed: scratch buffers are placed with mbind");
    return;
  }
  void *kind = effective == COLL_NUMA_MEM_HBM_INTERLEAVE ? *scratch_mk.hbw_interleave
                                                         : *scratch_mk.hbw_preferred;
  if (scratch_mk.check_available(kind) == SCRATCH_MEMKIND_SUCCESS) {
    ctx->scratch_kind_ = kind;
    ctx->scratch_way_ = SCRATCH_MEMKIND;
  }
}

static size_t scratch_round_page(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  return (size + page - 1) / page * page;
}

int coll_numa_scratch_alloc(coll_numa_ctx_t *ctx, size_t size, void **ptr_p) {
  if (ctx == NULL || size == 0 || ptr_p == NULL)
    return -EINVAL;
  if (ctx->scratch_way_ == SCRATCH_UNCHOSEN)
    scratch_choose(ctx);
  void *p = NULL;
  if (ctx->scratch_way_ == SCRATCH_MEMKIND) {
    int rc = scratch_mk.posix_memalign(ctx->scratch_kind_, &p, 64, size);
    if (rc == 0 && p != NULL) {
      *ptr_p = p;
      return 0;
    }
    /* a positive errno, or one of memkind's negative MEMKIND_ERROR_* codes (all allocation
     * failures) */
    return rc > 0 ? -rc : -ENOMEM;
  }
  size_t len = scratch_round_page(size);
  p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return -errno;
  if (ctx->scratch_way_ == SCRATCH_MMAP)
    coll__numa_place(ctx, p, len, &ctx->plan->ranks[ctx->local_rank].buf, "scratch buffer", NULL, 0);
  *ptr_p = p;
  return 0;
}

void coll_numa_scratch_free(coll_numa_ctx_t *ctx, void *ptr, size_t size) {
  if (ctx == NULL || ptr == NULL)
    return;
  if (ctx->scratch_way_ == SCRATCH_MEMKIND) {
    scratch_mk.free(ctx->scratch_kind_, ptr);
    return;
  }
  size_t len = scratch_round_page(size);
  if (ctx->plan->effective == COLL_NUMA_MEM_HBM_BIND) { /* it may count in the strict total */
    int mode = -1;
    unsigned long mask[COLL_NUMA_MASK_LONGS];
    if (syscall(SYS_get_mempolicy, &mode, mask, (unsigned long)(COLL_NUMA_MASK_LONGS * 64), ptr,
                (unsigned long)MPOL_F_ADDR) == 0 &&
        mode == MPOL_BIND)
      coll__numa_charge(ctx, &ctx->plan->ranks[ctx->local_rank].buf, (uint64_t)len, -1);
  }
  munmap(ptr, len);
}

/* The node most of [addr, addr+len)'s pages sit on, from move_pages(2) on up to 64 pages spread
 * over it; -1 when the kernel says nothing (no pages yet, move_pages refused). */
int coll_numa_pages_node(const void *addr, size_t len) {
  enum { SAMPLES = 64, NODES = 1024 };
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t first = (uintptr_t)addr / page * page;
  size_t npages = ((uintptr_t)addr + len - first + page - 1) / page;
  size_t n = npages < SAMPLES ? npages : SAMPLES;
  void *pages[SAMPLES];
  int status[SAMPLES];
  int count[NODES] = {0};
  if (n == 0)
    return -1;
  for (size_t i = 0; i < n; i++)
    pages[i] = (void *)(first + i * (npages / n) * page);
  if (syscall(SYS_move_pages, 0, (unsigned long)n, pages, NULL, status, 0) != 0)
    return -1;
  int best = -1;
  for (size_t i = 0; i < n; i++) {
    if (status[i] < 0 || status[i] >= NODES)
      continue;
    if (++count[status[i]] > (best < 0 ? 0 : count[best]))
      best = status[i];
  }
  return best;
}

int coll_numa_pool_alloc(coll_numa_ctx_t *ctx, size_t size, void **ptr_p, int *node_p) {
  int rc = coll_numa_scratch_alloc(ctx, size, ptr_p);
  if (rc)
    return rc;
  memset(*ptr_p, 0, size); /* every page placed now, and a new buffer reads as zeros */
  *node_p = coll_numa_pages_node(*ptr_p, size);
  return 0;
}
