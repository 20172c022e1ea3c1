/*
 * test_segments.c - the shared segment's life and the arena allocator.
 *
 *  segment    a communicator lives in one memfd ("memfd:hbmcoll" in
 *             /proc/self/maps): nothing appears in /dev/shm at any time, and
 *             after coll_comm_free the mapping is gone and /proc/self/fd holds
 *             exactly what it held before (memfd, pidfds, sockets closed);
 *             also across splits, progress threads and failed creations.
 *  arena      coll_arena_alloc / coll_arena_free with HBMCOLL_ARENA_BYTES
 *             small: alignment, bounds (coll_arena_contains), -ENOMEM when
 *             full or too big (also for sizes near SIZE_MAX), coalescing after
 *             frees in any order, padding given back, bad frees ignored, a
 *             random alloc/free run against a model, two threads at once, and
 *             an empty arena.
 *  prefault   pages the kernel cannot provide (past the end of a memfd: what a
 *             full node or tmpfs gives a fault) are -ENOMEM with a sentence
 *             naming the size, not SIGBUS later.
 *
 * Prints one line per case and a last line "N passed, N failed"; exits 1 on
 * any failure.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "coll.h"
#include "coll_internal.h" /* coll__segment_prefault */

/* ---- harness: fork P ranks, wait with a timeout, kill stragglers ------------ */

#define HARNESS_KEY_PREFIX "hbst"
#define MAX_RANKS 16
#define HARNESS_NAME_WIDTH 48
#include "harness.h"

/* Runs fn in `size` forked ranks with the "NAME=VALUE" strings of env set and
 * records a pass if every rank exited 0 before timeout_s. */
static int spawn(const char *name, int size, double timeout_s, const char *const *env, rank_fn fn, void *arg) {
  return spawn_expect(name, size, timeout_s, env, fn, arg, -1);
}

/* ---- what the process holds -------------------------------------------------- */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own fd */
}

/* names in /dev/shm, one string "\n"-separated (NULL if it cannot be read) */
static char *shm_list(void) {
  DIR *d = opendir("/dev/shm");
  if (d == NULL) return NULL;
  size_t cap = 4096, len = 0;
  char *s = malloc(cap);
  s[0] = '\0';
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    size_t n = strlen(e->d_name);
    if (len + n + 2 > cap) s = realloc(s, cap = 2 * (cap + n));
    memcpy(s + len, e->d_name, n);
    len += n;
    s[len++] = '\n';
    s[len] = '\0';
  }
  closedir(d);
  return s;
}

/* Entries of `now` missing from `before`, except POSIX semaphores ("sem.*")
 * that other programs on the machine make; writes them to out. */
static int shm_new(const char *before, const char *now, char *out, size_t outlen) {
  int n = 0;
  out[0] = '\0';
  if (before == NULL || now == NULL) return 0;
  for (const char *p = now; *p;) {
    const char *nl = strchr(p, '\n');
    size_t len = (size_t)(nl - p);
    char name[256];
    snprintf(name, sizeof name, "\n%.*s\n", (int)len, p);
    char *b = malloc(strlen(before) + 2);
    b[0] = '\n';
    strcpy(b + 1, before);
    if (strstr(b, name) == NULL && strncmp(p, "sem.", 4) != 0) {
      n++;
      size_t used = strlen(out);
      snprintf(out + used, outlen - used, " %.*s", (int)len, p);
    }
    free(b);
    p = nl + 1;
  }
  return n;
}

static int maps_has(const char *what) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL) return -1;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, what)) found = 1;
  fclose(f);
  return found;
}

/* ---- segment life ------------------------------------------------------------- */

static int run_some(coll_comm_t *c) {
  int size = coll_comm_size(c), rank = coll_comm_rank(c), bad = 0, rc;
  size_t n = 100000;
  float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
  for (size_t i = 0; i < n; i++) x[i] = (float)(rank + 1);
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_SUM, .count = n, .send = x, .recv = y};
  EXPECT((rc = coll_run(c, &a)) == 0, "rank %d: allreduce = %s", rank, coll_err_name(rc));
  EXPECT(y[n - 1] == (float)(size * (size + 1) / 2), "rank %d: allreduce result %g", rank, (double)y[n - 1]);
  coll_req_t *req = NULL; /* starts the progress thread */
  EXPECT((rc = coll_start(c, &a, &req)) == 0, "rank %d: coll_start = %s", rank, coll_err_name(rc));
  if (req) EXPECT((rc = coll_req_wait(req, -1)) == 0, "rank %d: request = %s", rank, coll_err_name(rc));
  coll_req_free(req);
  void *p = NULL;
  EXPECT((rc = coll_arena_alloc(c, 1 << 20, 4096, &p)) == 0, "rank %d: arena alloc = %s", rank, coll_err_name(rc));
  if (p) {
    memset(p, rank, 1 << 20); /* touch the arena pages too */
    coll_args_t b = {.kind = COLL_BCAST, .dtype = COLL_UINT8, .root = 0, .count = 1 << 20, .recv = p};
    EXPECT((rc = coll_run(c, &b)) == 0, "rank %d: bcast = %s", rank, coll_err_name(rc));
    EXPECT(((uint8_t *)p)[12345] == 0, "rank %d: bcast result", rank);
    coll_arena_free(c, p);
  }
  free(x);
  free(y);
  return bad;
}

static int rank_segment(int rank, int size, const char *key, void *arg) {
  (void)arg;
  int bad = 0, rc;
  char *shm0 = shm_list(), newer[512];
  int fds0 = count_fds();
  EXPECT(maps_has("memfd:hbmcoll") == 0, "rank %d: a segment is mapped before any communicator", rank);
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1;
  EXPECT(maps_has("memfd:hbmcoll") == 1, "rank %d: no memfd:hbmcoll mapping in /proc/self/maps", rank);
  int fds1 = count_fds();
  /* the memfd, and a pidfd per peer where the kernel has pidfd_open */
  EXPECT(fds1 >= fds0 + 1 && fds1 <= fds0 + size, "rank %d: %d fds before, %d with a communicator of %d", rank, fds0,
         fds1, size);
  bad |= run_some(c);
  coll_comm_t *sub = NULL;
  if ((rc = coll_comm_split(c, rank % 2, 0, &sub)) != 0) return 1;
  bad |= run_some(sub);
  char *shm1 = shm_list();
  EXPECT(shm_new(shm0, shm1, newer, sizeof newer) == 0, "rank %d: new in /dev/shm while running:%s", rank, newer);
  free(shm1);
  coll_args_t b = {.kind = COLL_BARRIER};
  EXPECT(coll_run(sub, &b) == 0, "rank %d: barrier", rank);
  EXPECT(coll_run(c, &b) == 0, "rank %d: barrier", rank);
  coll_comm_free(sub);
  coll_comm_free(c);
  int fds2 = count_fds();
  EXPECT(fds2 == fds0, "rank %d: %d fds before, %d after coll_comm_free", rank, fds0, fds2);
  EXPECT(maps_has("memfd:hbmcoll") == 0, "rank %d: the segment is still mapped after coll_comm_free", rank);
  char *shm2 = shm_list();
  EXPECT(shm_new(shm0, shm2, newer, sizeof newer) == 0, "rank %d: new in /dev/shm after free:%s", rank, newer);
  free(shm2);
  free(shm0);
  return bad;
}

/* Many communicators one after the other, some failing to start: nothing piles up. */
static int rank_cycles(int rank, int size, const char *key, void *arg) {
  (void)arg;
  int bad = 0, rc, fds0 = count_fds();
  for (int i = 0; i < 20 && !bad; i++) {
    char k[160];
    snprintf(k, sizeof k, "%s/cycle%d", key, i);
    coll_comm_t *c;
    if (comm_open(rank, size, k, 30, &c)) return 1;
    int32_t x = rank, y = -1;
    coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_MAX, .count = 1, .send = &x, .recv = &y};
    EXPECT((rc = coll_run(c, &a)) == 0 && y == size - 1, "rank %d: cycle %d: allreduce %s %d", rank, i, coll_err_name(rc), y);
    if (i % 3 == 0) { /* with a progress thread */
      coll_req_t *r;
      if (coll_start(c, &a, &r) == 0) coll_req_free(r);
    }
    coll_comm_free(c);
    int fds = count_fds();
    EXPECT(fds == fds0, "rank %d: cycle %d: %d fds, %d at the start", rank, i, fds, fds0);
  }
  /* creations that fail: a missing peer (rank 0 waits, the others find nobody) */
  for (int i = 0; i < 2 && !bad; i++) {
    char k[160];
    snprintf(k, sizeof k, "%s/alone%d.%d", key, i, rank); /* each rank alone */
    coll_comm_config_t cfg = {.rank = i == 0 ? 0 : 1, .size = 2, .job_key = k, .timeout_s = 0.3};
    coll_comm_t *c = NULL;
    rc = coll_comm_create(&cfg, &c);
    EXPECT(rc == COLL_EBOOTSTRAP, "rank %d: create alone = %s", rank, coll_err_name(rc));
    coll_comm_free(c);
    int fds = count_fds();
    EXPECT(fds == fds0, "rank %d: after a failed create (as rank %d): %d fds, %d at the start", rank, cfg.rank, fds, fds0);
  }
  EXPECT(maps_has("memfd:hbmcoll") == 0, "rank %d: a segment is still mapped", rank);
  return bad;
}

/* ---- arena ------------------------------------------------------------------------- */

#define ARENA_BYTES 65536

typedef struct {
  uint8_t *p;
  size_t bytes;
  uint8_t tag;
} blk_t;

static int blk_check(const blk_t *b, int n, const char *what) {
  int bad = 0;
  for (int i = 0; i < n && !bad; i++) {
    if (b[i].p == NULL) continue;
    for (size_t j = 0; j < b[i].bytes; j++)
      if (b[i].p[j] != b[i].tag) {
        EXPECT(0, "%s: block %d (%zu bytes) byte %zu overwritten", what, i, b[i].bytes, j);
        break;
      }
    for (int k = 0; k < i; k++) {
      if (b[k].p == NULL) continue;
      int overlap = b[i].p < b[k].p + (b[k].bytes ? b[k].bytes : 1) && b[k].p < b[i].p + (b[i].bytes ? b[i].bytes : 1);
      EXPECT(!overlap, "%s: blocks %d and %d overlap", what, i, k);
    }
  }
  return bad;
}

/* The whole arena in one piece: only if everything was given back and coalesced. */
static int arena_whole(coll_comm_t *c, const char *what) {
  int bad = 0;
  void *p = NULL;
  int rc = coll_arena_alloc(c, ARENA_BYTES, 4096, &p);
  EXPECT(rc == 0, "%s: the whole arena in one piece: %s", what, coll_err_name(rc));
  if (rc == 0) {
    EXPECT(coll_arena_contains(c, p, ARENA_BYTES) == 1, "%s: contains(whole)", what);
    void *q = NULL;
    EXPECT((rc = coll_arena_alloc(c, 1, 1, &q)) == -ENOMEM, "%s: alloc in a full arena = %s", what, coll_err_name(rc));
    coll_arena_free(c, p);
  }
  return bad;
}

static uint64_t rng_state = 88172645463325252ull;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

typedef struct {
  coll_comm_t *c;
  int bad;
  unsigned seed;
} thr_arg_t;

static void *arena_thread(void *arg) {
  thr_arg_t *t = arg;
  uint64_t s = t->seed;
  void *mine[8] = {0};
  for (int i = 0; i < 20000; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    int k = (int)((s >> 33) % 8);
    if (mine[k]) {
      uint8_t tag = (uint8_t)(k + 16 * (int)t->seed);
      if (((uint8_t *)mine[k])[0] != tag || ((uint8_t *)mine[k])[127] != tag) t->bad = 1;
      coll_arena_free(t->c, mine[k]);
      mine[k] = NULL;
    } else if (coll_arena_alloc(t->c, 128, 64, &mine[k]) == 0) {
      memset(mine[k], k + 16 * (int)t->seed, 128);
    } else {
      mine[k] = NULL;
    }
  }
  for (int k = 0; k < 8; k++) coll_arena_free(t->c, mine[k]);
  return NULL;
}

static int rank_arena(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1; /* HBMCOLL_ARENA_BYTES=65536 */
  int bad = 0, rc;
  void *p = NULL, *q = NULL;
  bad |= arena_whole(c, "fresh");

  /* alignment and bounds */
  static const size_t aligns[] = {1, 2, 8, 64, 256, 1024, 4096};
  static const size_t sizes[] = {0, 1, 63, 64, 65, 1000, 4096};
  blk_t b[64];
  int nb = 0;
  for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++)
    for (size_t j = 0; j < sizeof sizes / sizeof sizes[0]; j++) {
      void *x = NULL;
      rc = coll_arena_alloc(c, sizes[j], aligns[i], &x);
      if (rc == -ENOMEM) continue; /* the arena is small; the tail of the list may not fit */
      EXPECT(rc == 0, "alloc(%zu, %zu) = %s", sizes[j], aligns[i], coll_err_name(rc));
      if (rc) continue;
      EXPECT(((uintptr_t)x & (aligns[i] - 1)) == 0, "alloc(%zu, align %zu) = %p", sizes[j], aligns[i], x);
      EXPECT(((uintptr_t)x & 63) == 0, "alloc(%zu, align %zu) = %p: not on a cache line", sizes[j], aligns[i], x);
      EXPECT(coll_arena_contains(c, x, sizes[j]) == 1, "contains(alloc(%zu))", sizes[j]);
      EXPECT(coll_arena_contains(c, x, ARENA_BYTES + 1) == 0, "contains(more than the arena)");
      b[nb].p = x;
      b[nb].bytes = sizes[j];
      b[nb].tag = (uint8_t)(nb + 1);
      memset(x, b[nb].tag, sizes[j]);
      nb++;
    }
  EXPECT(nb >= 20, "only %d of the small allocations fit", nb);
  bad |= blk_check(b, nb, "aligned allocations");
  for (int i = 0; i < nb; i += 2) coll_arena_free(c, b[i].p), b[i].p = NULL;
  bad |= blk_check(b, nb, "after freeing half");
  for (int i = 1; i < nb; i += 2) coll_arena_free(c, b[i].p), b[i].p = NULL;
  bad |= arena_whole(c, "after the aligned allocations");
  int32_t stack_var = 0;
  EXPECT(coll_arena_contains(c, &stack_var, sizeof stack_var) == 0, "contains(stack)");
  EXPECT(coll_arena_contains(c, NULL, 0) == 0, "contains(NULL)");

  /* fill with 64-byte blocks until -ENOMEM */
  enum { NFILL = ARENA_BYTES / 64 };
  void **fill = calloc(NFILL + 1, sizeof *fill);
  int nfill = 0;
  while (nfill <= NFILL && (rc = coll_arena_alloc(c, 64, 64, &fill[nfill])) == 0) nfill++;
  EXPECT(rc == -ENOMEM, "filling the arena ended with %s", coll_err_name(rc));
  EXPECT(nfill == NFILL, "%d blocks of 64 bytes fit, want %d", nfill, NFILL);
  for (int i = nfill - 1; i >= 0; i -= 2) coll_arena_free(c, fill[i]);
  EXPECT((rc = coll_arena_alloc(c, 128, 64, &p)) == -ENOMEM, "128 bytes fit between 64-byte holes: %s", coll_err_name(rc));
  for (int i = nfill - 2; i >= 0; i -= 2) coll_arena_free(c, fill[i]);
  free(fill);
  bad |= arena_whole(c, "after filling and freeing in reverse, odd then even");

  /* fragmentation: 16 x 4 KiB, free the odd ones: no 8 KiB piece; then the rest */
  void *pages[16];
  for (int i = 0; i < 16; i++) EXPECT((rc = coll_arena_alloc(c, 4096, 4096, &pages[i])) == 0, "page %d: %s", i, coll_err_name(rc));
  for (int i = 1; i < 16; i += 2) coll_arena_free(c, pages[i]);
  EXPECT((rc = coll_arena_alloc(c, 8192, 64, &p)) == -ENOMEM, "8 KiB out of 4 KiB holes: %s", coll_err_name(rc));
  EXPECT((rc = coll_arena_alloc(c, 4096, 4096, &p)) == 0, "4 KiB in a 4 KiB hole: %s", coll_err_name(rc));
  coll_arena_free(c, p);
  for (int i = 0; i < 16; i += 2) coll_arena_free(c, pages[i]);
  bad |= arena_whole(c, "after the pages");

  /* padding is given back: 64 bytes, then 64 bytes aligned to 4096 (pad 4032) */
  EXPECT((rc = coll_arena_alloc(c, 64, 64, &p)) == 0, "64: %s", coll_err_name(rc));
  EXPECT((rc = coll_arena_alloc(c, 64, 4096, &q)) == 0, "64 aligned 4096: %s", coll_err_name(rc));
  EXPECT((uint8_t *)q - (uint8_t *)p == 4096, "aligned block at +%td", (uint8_t *)q - (uint8_t *)p);
  coll_arena_free(c, q);
  coll_arena_free(c, p);
  bad |= arena_whole(c, "after padding");

  /* too big */
  static const size_t huge[] = {ARENA_BYTES + 1, (size_t)ARENA_BYTES * 2, SIZE_MAX / 2, SIZE_MAX - 4096,
                                SIZE_MAX - 63,  SIZE_MAX - 10,             SIZE_MAX};
  for (size_t i = 0; i < sizeof huge / sizeof huge[0]; i++) {
    p = NULL;
    rc = coll_arena_alloc(c, huge[i], 64, &p);
    EXPECT(rc == -ENOMEM, "alloc(%zu) = %s, want ENOMEM", huge[i], coll_err_name(rc));
    EXPECT(p == NULL, "alloc(%zu) wrote *ptr_p on failure", huge[i]);
    if (rc == 0) coll_arena_free(c, p);
  }
  bad |= arena_whole(c, "after the huge requests");

  /* bad frees are ignored and corrupt nothing */
  EXPECT((rc = coll_arena_alloc(c, 256, 64, &p)) == 0, "256: %s", coll_err_name(rc));
  coll_arena_free(c, NULL);
  coll_arena_free(c, (uint8_t *)p + 64); /* inside a block */
  void *heap = malloc(64);
  coll_arena_free(c, heap); /* not the arena at all */
  free(heap);
  coll_arena_free(c, p);
  coll_arena_free(c, p); /* twice */
  bad |= arena_whole(c, "after bad frees");

  /* random allocations and frees against a model */
  blk_t live[48];
  memset(live, 0, sizeof live);
  for (int step = 0; step < 4000 && !bad; step++) {
    int k = (int)(rng() % 48);
    if (live[k].p) {
      bad |= blk_check(&live[k], 1, "random run");
      coll_arena_free(c, live[k].p);
      live[k].p = NULL;
      continue;
    }
    size_t bytes = (size_t)(rng() % 3000), align = (size_t)1 << (rng() % 13);
    void *x = NULL;
    rc = coll_arena_alloc(c, bytes, align, &x);
    if (rc == -ENOMEM) continue;
    EXPECT(rc == 0 && ((uintptr_t)x & (align - 1)) == 0 && coll_arena_contains(c, x, bytes),
           "random run: alloc(%zu, %zu) = %s %p", bytes, align, coll_err_name(rc), x);
    live[k].p = x;
    live[k].bytes = bytes;
    live[k].tag = (uint8_t)(step | 1);
    memset(x, live[k].tag, bytes);
    if (step % 100 == 0) bad |= blk_check(live, 48, "random run");
  }
  bad |= blk_check(live, 48, "random run");
  for (int k = 0; k < 48; k++) coll_arena_free(c, live[k].p);
  bad |= arena_whole(c, "after the random run");

  /* two threads */
  thr_arg_t t1 = {c, 0, 1}, t2 = {c, 0, 2};
  pthread_t th1, th2;
  pthread_create(&th1, NULL, arena_thread, &t1);
  pthread_create(&th2, NULL, arena_thread, &t2);
  pthread_join(th1, NULL);
  pthread_join(th2, NULL);
  EXPECT(!t1.bad && !t2.bad, "threads saw each other's blocks");
  bad |= arena_whole(c, "after two threads");

  /* arena buffers still work in collectives, and blocks left allocated are freed with the communicator */
  EXPECT((rc = coll_arena_alloc(c, 4000, 64, &p)) == 0, "4000: %s", coll_err_name(rc));
  if (rc == 0) {
    float *f = p;
    for (int i = 0; i < 1000; i++) f[i] = (float)(rank + i);
    coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_FLOAT32, .op = COLL_MAX, .count = 1000, .send = f, .recv = f};
    EXPECT((rc = coll_run(c, &a)) == 0, "allreduce in the arena: %s", coll_err_name(rc));
    EXPECT(f[999] == (float)(size - 1 + 999), "allreduce in the arena: %g", (double)f[999]);
  }
  coll_args_t bar = {.kind = COLL_BARRIER};
  EXPECT(coll_run(c, &bar) == 0, "barrier");
  coll_comm_free(c);
  return bad;
}

static int rank_arena_empty(int rank, int size, const char *key, void *arg) {
  (void)arg;
  coll_comm_t *c;
  if (comm_open(rank, size, key, 30, &c)) return 1; /* HBMCOLL_ARENA_BYTES=0 */
  int bad = 0, rc;
  void *p = NULL;
  EXPECT((rc = coll_arena_alloc(c, 64, 64, &p)) == -ENOMEM, "alloc in an empty arena = %s", coll_err_name(rc));
  EXPECT(p == NULL, "ptr written on failure");
  EXPECT((rc = coll_arena_alloc(c, 0, 1, &p)) == -ENOMEM, "alloc(0) in an empty arena = %s", coll_err_name(rc));
  /* collectives do not need the arena */
  int32_t x = rank, y = -1;
  coll_args_t a = {.kind = COLL_ALLREDUCE, .dtype = COLL_INT32, .op = COLL_SUM, .count = 1, .send = &x, .recv = &y};
  EXPECT((rc = coll_run(c, &a)) == 0 && y == size * (size - 1) / 2, "allreduce: %s %d", coll_err_name(rc), y);
  coll_comm_free(c);
  return bad;
}

/* The pre-fault of a new segment: mapped pages with nothing behind them (the memfd is
 * shorter than the mapping, so the kernel refuses them as it refuses pages of a full node)
 * must come back as -ENOMEM and a sentence with the size, and backed pages as 0. */
static void check_prefault(void) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE), len = 256 * page;
  int fd = memfd_create("hbmcoll-test", MFD_CLOEXEC);
  char text[COLL_TEXT_MAX] = "", why[COLL_TEXT_MAX + 64] = "";
  uint8_t *p = fd < 0 || ftruncate(fd, (off_t)(len / 2)) != 0 ? MAP_FAILED
             : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int backed = -1, short_rc = -1;
  if (p != MAP_FAILED) {
    backed = coll__segment_prefault(p, len / 2, text, sizeof text);
    short_rc = coll__segment_prefault(p, len, text, sizeof text);
    munmap(p, len);
  }
  if (fd >= 0) close(fd);
  int ok = p != MAP_FAILED && backed == 0 && short_rc == -ENOMEM &&
           strstr(text, "out of memory") && strstr(text, "1.0 MiB") && strstr(text, "node");
  snprintf(why, sizeof why, "backed %d, short %d: %s", backed, short_rc, text);
  record(ok, "prefault: pages without memory are -ENOMEM, said", 1, 0, ok ? NULL : why);
}

int main(int argc, char **argv) {
  const char *only = argc > 1 ? argv[1] : NULL;
  const char *const small_arena[] = {"HBMCOLL_ARENA_BYTES=65536", NULL};
  const char *const no_arena[] = {"HBMCOLL_ARENA_BYTES=0", NULL};
  static const int sizes[] = {1, 2, 3, 5};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    int P = sizes[i];
    char *before = shm_list(), newer[512];
    if (CASE("segment: memfd only, fds and mapping released"))
      spawn("segment: memfd only, fds and mapping released", P, 120, NULL, rank_segment, NULL);
    if (CASE("segment: create/free cycles, failed creates")) spawn("segment: create/free cycles, failed creates", P, 120, NULL, rank_cycles, NULL);
    char *after = shm_list();
    int n = shm_new(before, after, newer, sizeof newer);
    record(n == 0, "segment: /dev/shm unchanged after the ranks left", P, 0, n ? newer : NULL);
    free(before);
    free(after);
  }
  for (int P = 1; P <= 3; P++) {
    if (CASE("arena: HBMCOLL_ARENA_BYTES=65536")) spawn("arena: HBMCOLL_ARENA_BYTES=65536", P, 120, small_arena, rank_arena, NULL);
    if (CASE("arena: HBMCOLL_ARENA_BYTES=0")) spawn("arena: HBMCOLL_ARENA_BYTES=0", P, 60, no_arena, rank_arena_empty, NULL);
  }
  if (CASE("prefault")) check_prefault();
  return harness_finish();
}
