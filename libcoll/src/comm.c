/*
 * comm.c - creating, splitting and freeing communicators.
 *
 * Rank 0 sizes and creates the segment, writes the header and pre-faults the
 * control and staging areas (so a full node shows up now, not as SIGBUS
 * later); the bootstrap hands the fd to the others, who map it by its size
 * and check the header, and every rank gets pidfds of the others. Then each
 * rank records its pid and CPU mask, and a barrier makes sure everyone is
 * mapped before the first collective.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coll_internal.h"
#include "nodes.h"
#include "tree.h"
#include "p2p.h"

#define COMM_PAGE 4096
#define COMM_ALIGN(x, a) (((x) + (a)-1) & ~(size_t)((a)-1))

static void comm_layout(coll__header_t *h, int size, const coll__params_t *p) {
  h->magic = COLL_SEG_MAGIC;
  h->size = size;
  h->ctl_off = COMM_PAGE;
  h->slot_off = COMM_ALIGN(h->ctl_off + (size_t)size * sizeof(coll__ctl_t), COMM_PAGE);
  /* alltoall, scatter and reduce_scatter cut a slot into `size` pieces of
   * whole cache lines: at least 64 bytes each */
  size_t slot_min = COMM_ALIGN((size_t)size * 64, COMM_PAGE);
  h->slot_bytes = p->slot_bytes > slot_min ? p->slot_bytes : slot_min;
  size_t arena_off = h->slot_off + (size_t)size * 2 * h->slot_bytes;
  h->arena_off = COMM_ALIGN(arena_off, (size_t)2 << 20); /* huge-page friendly */
  h->arena_bytes = p->arena_bytes;
  h->stream_min = p->stream_min;
  h->push_min = p->push_min;
  h->push_stream_min = p->push_stream_min;
  h->small_max = p->small_max;
  h->cma_min = p->cma_min;
  h->stage_auto = p->stage_stream_auto;
  h->cma_auto = p->cma == COLL_CMA_AUTO;
  h->cma_kinds = (p->cma == 1 || p->cma == 2 || h->cma_auto ? 1u << COLL_GATHER : 0) |
                 (p->cma == 1 || p->cma == 3 ? 1u << COLL_BCAST : 0);
  h->total_bytes = h->arena_off + (size_t)size * p->arena_bytes;
  /* point-to-point last (p2p.h): not pre-faulted, so only the channels of pairs that talk
   * ever take memory */
  h->p2p_cells = p->p2p_cells;
  h->p2p_stride = COLL_P2P_CHAN_HEAD + p->p2p_cells * COLL_P2P_CELL;
  h->p2p_off = COMM_ALIGN(h->total_bytes, COMM_PAGE);
  h->total_bytes = h->p2p_off + (size_t)size * COLL_LINE + (size_t)size * (size_t)size * h->p2p_stride;
}

/* Huge pages for the arena where the kernel grants them to shared memory
 * (shmem_enabled "advise" or "within_size"): fewer page walks for large
 * arena streams (bench/README.md, "Measurements behind the code"); with
 * "never" this is a no-op. Only the arena, and only when each
 * rank's part is whole huge pages: a huge page shared by two ranks' slots or
 * arenas could not sit on both ranks' NUMA nodes. Every rank advises its own
 * mapping, since the rank that touches a page first decides its size. */
static void comm_advise_huge(coll_comm_t *c, const coll__header_t *h) {
  const size_t huge = (size_t)2 << 20;
  if (h->arena_bytes == 0 || h->arena_bytes % huge || h->arena_off % huge) return;
  madvise(c->base + h->arena_off, (size_t)c->size * h->arena_bytes, MADV_HUGEPAGE);
}

static int comm_map_segment(coll_comm_t *c) {
  struct stat st;
  if (fstat(c->fd, &st) != 0) return -errno;
  int rc = coll__segment_map(c->fd, (size_t)st.st_size, &c->base);
  if (rc) return rc;
  c->map_bytes = (size_t)st.st_size;
  c->hdr = (coll__header_t *)c->base;
  if (c->hdr->magic != COLL_SEG_MAGIC || c->hdr->size != c->size ||
      c->hdr->total_bytes != c->map_bytes)
    return COLL_EBOOTSTRAP;
  c->ctl = (coll__ctl_t *)(c->base + c->hdr->ctl_off);
  comm_advise_huge(c, c->hdr);
  return 0;
}

static int comm_fail_local(coll_comm_t *c, int code, const char *what) {
  c->error = code;
  snprintf(c->error_text, sizeof c->error_text, "%s: %s", what, coll_strerror(code));
  return code;
}

static void comm_record_identity(coll_comm_t *c) {
  coll__ctl_t *me = &c->ctl[c->rank];
  me->pid = (int32_t)getpid();
  struct stat ns;
  me->pidns = stat("/proc/self/ns/pid", &ns) == 0 ? (uint64_t)ns.st_ino : 0;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    for (int cpu = 0; cpu < 1024 && cpu < CPU_SETSIZE; cpu++)
      if (CPU_ISSET(cpu, &set)) me->cpumask[cpu / 64] |= 1ull << (cpu % 64);
  me->pu = me->tile = me->cluster = -1;
  if (sched_getaffinity(0, sizeof set, &set) == 0) coll__tree_locate(&set, &me->pu, &me->tile, &me->cluster);
}

/* Before anything touches the segment: control and staging areas near the
 * ranks that use them all, each rank's arena part near that rank. The policy
 * lives on the memfd object, so pages other ranks fault in follow it too.
 * Placement is advice: a failure leaves the default policy. */
static void comm_place(coll_comm_t *c, const coll__header_t *h) {
  if (c->place == NULL) return;
  int rc = c->place(c->place_arg, c->base, h->arena_off, c->local_of, c->size);
  for (int r = 0; r < c->size && h->arena_bytes && rc == 0; r++)
    rc = c->place(c->place_arg, c->base + h->arena_off + (size_t)r * h->arena_bytes, h->arena_bytes,
                  &c->local_of[r], 1);
  if (rc) coll__warn(c, "placing the shared segment failed (%s): it stays on the default memory "
                        "policy", coll_strerror(rc));
}

_Atomic unsigned coll__fork_epoch;
static pthread_once_t comm_atfork_once = PTHREAD_ONCE_INIT;
static void comm_in_child(void) { atomic_fetch_add(&coll__fork_epoch, 1); }
static void comm_atfork(void) { pthread_atfork(NULL, NULL, comm_in_child); }

/* Creation may fail half way; *comm_p gets a communicator either way so the
 * caller can read the error text, and must free it. */
static int comm_create(const coll_comm_config_t *cfg, coll_comm_t *c) {
  int rc;
  c->fd = -1;
  pthread_once(&comm_atfork_once, comm_atfork);
  c->owner_pid = getpid();
  c->owner_epoch = atomic_load(&coll__fork_epoch);
  c->creating = 1;
  c->warn_fn = cfg->warn;
  c->warn_arg = cfg->warn_arg;
  if ((rc = coll__params_load(&c->params, c->error_text, sizeof c->error_text)) != 0)
    return c->error = rc;
  if (cfg->timeout_s > 0) c->params.timeout_s = cfg->timeout_s;
  c->rank = cfg->rank;
  c->size = cfg->size;
  c->tp = &coll__shm_transport;
  c->slot_reader[0] = c->slot_reader[1] = -1;
  c->key = strdup(cfg->job_key);
  c->seen_done = calloc((size_t)cfg->size, sizeof *c->seen_done);
  c->pidfd = malloc((size_t)cfg->size * sizeof *c->pidfd);
  c->local_of = malloc((size_t)cfg->size * sizeof *c->local_of);
  if (!c->key || !c->seen_done || !c->pidfd || !c->local_of)
    return comm_fail_local(c, -ENOMEM, "out of memory");
  for (int r = 0; r < c->size; r++) {
    c->pidfd[r] = -1;
    c->local_of[r] = cfg->local_ranks ? cfg->local_ranks[r] : r;
  }
  c->place = cfg->place;
  c->place_arg = cfg->place_arg;
  c->interrupt_fn = cfg->interrupt;
  c->interrupt_arg = cfg->interrupt_arg;

  if (c->rank == 0) {
    coll__header_t h;
    memset(&h, 0, sizeof h);
    comm_layout(&h, c->size, &c->params);
    if ((rc = coll__segment_create(h.total_bytes, &c->fd)) != 0)
      return comm_fail_local(c, rc, "could not create the shared segment (memfd_create)");
    if ((rc = coll__segment_map(c->fd, h.total_bytes, &c->base)) != 0) {
      /* the arena is virtual, but it counts against address-space limits (ulimit -v, valgrind) */
      char what[160];
      snprintf(what, sizeof what, "could not map the shared segment of %.1f GiB "
               "(HBMCOLL_ARENA_BYTES for each of %d ranks; lower it)",
               (double)h.total_bytes / (double)(1u << 30), c->size);
      return comm_fail_local(c, rc, what);
    }
    c->map_bytes = h.total_bytes;
    c->hdr = (coll__header_t *)c->base;
    comm_advise_huge(c, &h);
    comm_place(c, &h); /* before the first touch, the header page included */
    if (getrandom(h.secret, sizeof h.secret, 0) != (ssize_t)sizeof h.secret)
      return comm_fail_local(c, -errno, "could not draw the communicator's secret (getrandom)");
    memcpy(c->hdr, &h, sizeof h);
    c->ctl = (coll__ctl_t *)(c->base + h.ctl_off);
    if ((rc = coll__segment_prefault(c->base + h.ctl_off, h.arena_off - h.ctl_off, c->error_text,
                                     sizeof c->error_text)) != 0)
      return c->error = rc;
  }
  char err[COLL_TEXT_MAX] = "";
  rc = coll__bootstrap(c, &c->fd, err, sizeof err);
  if (rc) {
    c->error = rc == -ETIMEDOUT || rc == COLL_EBOOTSTRAP ? COLL_EBOOTSTRAP : rc;
    snprintf(c->error_text, sizeof c->error_text, "%s", err[0] ? err : coll_strerror(rc));
    return c->error;
  }
  if (c->rank != 0 && (rc = comm_map_segment(c)) != 0)
    return comm_fail_local(c, rc, "could not map the segment rank 0 sent");
  comm_record_identity(c);
  coll__cma_publish_probe(c);
  if ((rc = coll__arena_init(c)) != 0) return comm_fail_local(c, rc, "arena");
  c->spin_iters = c->params.spin_iters;
  if (c->spin_iters < 0) c->spin_iters = 20000; /* until every rank's CPU mask is known */
  c->yield_budget = 1 << 30;
  coll_args_t barrier = {.kind = COLL_BARRIER};
  c->allow_interrupt = 1;
  rc = coll__execute(c, &barrier);
  if (rc == 0) { /* single copy: every rank tries every peer, then all agree */
    if (c->rank == 0) c->hdr->roomy = coll__job_cpus(c) >= c->size; /* all CPU masks are in */
    coll__cma_check_peers(c);
    coll__p2p_probe(c);
    rc = coll__execute(c, &barrier);
    coll__cma_agree(c);
  }
  if (rc == 0) rc = coll__stage_probe(c); /* collective: every rank, or none (the header says) */
  if (rc == 0) rc = coll__cma_probe(c);   /* likewise */
  c->allow_interrupt = 0;
  c->creating = 0;
  if (rc) return rc;
  c->extra_seq = c->seq; /* error messages number the caller's collectives from 1 */
  if ((rc = coll__tree_init(c)) != 0) /* every rank's place is known since the barrier */
    return comm_fail_local(c, rc, "out of memory");
  /* Oversubscribed (more ranks than the job's CPUs): a waiting rank must get
   * off the CPU quickly, since the rank it waits for may need that very CPU;
   * sched_yield does not reliably hand it over (CFS), a futex sleep does. */
  int roomy = coll__job_cpus(c) >= c->size;
  if (c->params.spin_iters < 0) c->spin_iters = roomy ? 20000 : 64;
  c->yield_budget = roomy ? 1 << 30 : 2;
  return 0;
}

static int comm_create_from(const coll_comm_config_t *cfg, coll_comm_t *parent,
                            coll_comm_t **comm_p) {
  if (cfg == NULL || comm_p == NULL || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size ||
      cfg->job_key == NULL || cfg->job_key[0] == '\0')
    return COLL_EBADARG;
  coll_comm_t *c = calloc(1, sizeof *c);
  if (c == NULL) return -ENOMEM;
  c->parent = parent;
  int rc = comm_create(cfg, c);
  c->parent = NULL;
  *comm_p = c; /* even on failure: coll_comm_error() says why; free it */
  return rc;
}

int coll_comm_create(const coll_comm_config_t *cfg, coll_comm_t **comm_p) {
  return comm_create_from(cfg, NULL, comm_p);
}

typedef struct {
  int32_t color, key, rank;
} comm_member_t;

static int comm_member_cmp(const void *x, const void *y) {
  const comm_member_t *a = x, *b = y;
  if (a->key != b->key) return a->key < b->key ? -1 : 1;
  return (a->rank > b->rank) - (a->rank < b->rank);
}

int coll_comm_split(coll_comm_t *c, int color, int key, coll_comm_t **comm_p) {
  if (c == NULL || comm_p == NULL) return COLL_EBADARG;
  if (coll__forked(c)) return COLL_EFORKED;
  if (c->span) return coll__span_split(c, color, key, comm_p); /* nodes_split.c */
  comm_member_t mine = {color < 0 ? -1 : color, key, c->rank};
  comm_member_t *all = calloc((size_t)c->size, sizeof *all);
  if (all == NULL) return -ENOMEM;
  coll_args_t a = {.kind = COLL_ALLGATHER, .dtype = COLL_INT32, .count = 3, .send = &mine, .recv = all};
  int rc = coll_run(c, &a);
  uint64_t split_no = ++c->splits;
  if (rc || color < 0) {
    free(all);
    if (rc == 0) *comm_p = NULL;
    return rc;
  }
  int n = 0;
  for (int r = 0; r < c->size; r++)
    if (all[r].color == color) all[n++] = all[r];
  qsort(all, (size_t)n, sizeof *all, comm_member_cmp);
  int newrank = 0;
  for (int i = 0; i < n; i++)
    if (all[i].rank == c->rank) newrank = i;
  /* the parent's secret (only its members can read the segment): the new
   * rendezvous cannot be guessed from outside, and nested splits never grow
   * the key nor cut off what tells sibling groups apart */
  char subkey[96];
  int used = snprintf(subkey, sizeof subkey, "split.");
  for (size_t i = 0; i < sizeof c->hdr->secret; i++)
    used += snprintf(subkey + used, sizeof subkey - (size_t)used, "%02x", c->hdr->secret[i]);
  snprintf(subkey + used, sizeof subkey - (size_t)used, "/s%llu.%d",
           (unsigned long long)split_no, color);
  int *local = malloc((size_t)n * sizeof *local);
  if (local == NULL) {
    free(all);
    return -ENOMEM;
  }
  for (int i = 0; i < n; i++) local[i] = c->local_of[all[i].rank];
  free(all);
  coll_comm_config_t cfg = {.rank = newrank, .size = n, .job_key = subkey,
                            .timeout_s = c->params.timeout_s, .warn = c->warn_fn,
                            .warn_arg = c->warn_arg, .place = c->place,
                            .place_arg = c->place_arg, .local_ranks = local,
                            .interrupt = c->interrupt_fn, .interrupt_arg = c->interrupt_arg};
  rc = comm_create_from(&cfg, c, comm_p);
  free(local);
  if (rc == COLL_EINTERRUPTED && !coll__aborted(c))
    coll__fail(c, COLL_EPEERLOST, "rank %d was interrupted by a signal in split #%llu; the "
               "communicator is closed", c->rank, (unsigned long long)split_no);
  else if (rc != 0 && !coll__aborted(c)) /* its group's other ranks would wait for it */
    coll__fail(c, rc, "rank %d could not create its part of split #%llu: %s", c->rank,
               (unsigned long long)split_no, *comm_p ? (*comm_p)->error_text : coll_strerror(rc));
  return rc;
}

void coll_comm_leave(coll_comm_t *c) {
  if (c != NULL && c->span && !coll__forked(c)) {
    coll__span_leave(c);
    return;
  }
  if (c == NULL || c->ctl == NULL || coll__forked(c) || atomic_load(&c->ctl[c->rank].left))
    return;
  atomic_store(&c->ctl[c->rank].left, 1);
  coll__wake_all(c); /* sleepers re-check and find out */
  if (c->error == 0) {
    c->error = COLL_EABORTED;
    snprintf(c->error_text, sizeof c->error_text, "this rank closed the communicator");
  }
}

void coll_comm_free(coll_comm_t *c) {
  if (c == NULL) return;
  if (c->span) {
    coll__span_free(c);
    return;
  }
  if (coll__forked(c)) /* the parent's thread is not in this process: nothing to join */
    coll__worker_forget(c);
  else
    coll__worker_stop(c);
  coll__p2p_destroy(c); /* its pending requests fail; it no longer touches the mapping */
  coll_comm_leave(c);
  coll__arena_destroy(c);
  coll__tree_free(c);
  if (c->base) munmap(c->base, c->map_bytes);
  if (c->fd >= 0) close(c->fd);
  if (c->pidfd)
    for (int r = 0; r < c->size; r++)
      if (c->pidfd[r] >= 0) close(c->pidfd[r]);
  free(c->pidfd);
  free(c->local_of);
  free(c->seen_done);
  free(c->key);
  free(c);
}

void coll_comm_abort(coll_comm_t *c, int reason) {
  if (c == NULL) return;
  if (reason >= 0 || reason <= COLL_ERR_LAST_) reason = COLL_EABORTED;
  if (coll__forked(c)) return; /* the parent's communicator: not ours to fail */
  if (c->span) {
    coll__span_abort(c, reason);
    return;
  }
  if (c->hdr == NULL) {
    c->error = reason;
    return;
  }
  if (reason == COLL_EPEERLOST)
    coll__fail(c, reason, "rank %d lost a peer it depends on (another node's rank) and ended the communicator", c->rank);
  else
    coll__fail(c, reason, "rank %d aborted the communicator", c->rank);
}

int coll_comm_forked(const coll_comm_t *c) { return c != NULL && coll__forked(c); }
int coll_comm_owner_pid(const coll_comm_t *c) { return c ? (int)c->owner_pid : -1; }

int coll_comm_rank(const coll_comm_t *c) { return c ? c->rank : -1; }
int coll_comm_size(const coll_comm_t *c) { return c ? c->size : -1; }

void coll_comm_set_interrupt(coll_comm_t *c, coll_interrupt_fn fn, void *arg) {
  if (c->span) coll__span_set_interrupt(c, fn, arg);
  c->interrupt_fn = fn;
  c->interrupt_arg = arg;
}

void coll__keep_text(coll_comm_t *c, const char *text) {
  if (c->span) coll__span_keep_text(c, text);
  else if (c->error == 0 && (text[0] || c->error_text[0])) snprintf(c->error_text, sizeof c->error_text, "%s", text);
}

int coll_comm_error(const coll_comm_t *c, const char **text_p) {
  if (c == NULL) return COLL_EBADARG;
  if (c->span) return coll__span_error(c, text_p);
  if (text_p) *text_p = c->error_text;
  return c->error;
}
