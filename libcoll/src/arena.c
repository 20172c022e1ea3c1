/*
 * arena.c - zero-copy buffers: each rank owns a contiguous part of the
 * communicator's arena (the tail of the shared segment) and hands out pieces
 * of it with a first-fit free list kept in private memory. Peers can read a
 * rank's arena buffer at the same segment offset, which is what lets
 * collectives skip a copy. Pages are faulted in by their first user.
 */
#include <errno.h>
#include <stdlib.h>

#include "coll_internal.h"

typedef struct arena_block {
  size_t off, len; /* free: the block; used: off = user offset, len = pad + rounded size */
  size_t pad;      /* used: alignment padding before off */
  struct arena_block *next;
} arena_block_t;

struct coll__arena {
  uint8_t *start; /* my part */
  size_t bytes;
  arena_block_t *free_list; /* sorted by offset, coalesced */
  arena_block_t *used;      /* handed out: off = user offset, len = whole block */
  pthread_mutex_t lock;     /* arrays may be freed from any thread */
};

int coll__arena_init(coll_comm_t *c) {
  coll__arena_t *ar = calloc(1, sizeof *ar);
  if (ar == NULL) return -ENOMEM;
  ar->bytes = c->hdr->arena_bytes;
  ar->start = c->base + c->hdr->arena_off + (size_t)c->rank * ar->bytes;
  pthread_mutex_init(&ar->lock, NULL);
  if (ar->bytes) {
    ar->free_list = calloc(1, sizeof *ar->free_list);
    if (ar->free_list == NULL) {
      free(ar);
      return -ENOMEM;
    }
    ar->free_list->len = ar->bytes;
  }
  c->arena = ar;
  return 0;
}

static void arena_free_list(arena_block_t *b) {
  while (b) {
    arena_block_t *n = b->next;
    free(b);
    b = n;
  }
}

void coll__arena_destroy(coll_comm_t *c) {
  if (c->arena == NULL) return;
  arena_free_list(c->arena->free_list);
  arena_free_list(c->arena->used);
  pthread_mutex_destroy(&c->arena->lock);
  free(c->arena);
  c->arena = NULL;
}

int coll_arena_alloc(coll_comm_t *c, size_t bytes, size_t align, void **ptr_p) {
  c = coll__comm_here(c); /* across nodes: the node's arena */
  if (c != NULL && coll__forked(c)) return COLL_EFORKED; /* the parent's arena */
  if (c == NULL || ptr_p == NULL || c->arena == NULL || align == 0 || (align & (align - 1)) || align > 4096)
    return COLL_EBADARG;
  coll__arena_t *ar = c->arena;
  if (bytes == 0) bytes = 1;
  if (bytes > ar->bytes) return -ENOMEM; /* also keeps the rounding below from wrapping */
  bytes = (bytes + 63) & ~(size_t)63; /* whole cache lines: no false sharing */
  arena_block_t *used = malloc(sizeof *used);
  if (used == NULL) return -ENOMEM;
  pthread_mutex_lock(&ar->lock);
  arena_block_t **link = &ar->free_list;
  for (arena_block_t *b = *link; b; link = &b->next, b = b->next) {
    size_t pad = (align - (((uintptr_t)ar->start + b->off) & (align - 1))) & (align - 1);
    if (b->len < pad + bytes) continue;
    /* the block is taken from its start (padding included) so it can be returned whole */
    used->off = b->off + pad;
    used->pad = pad;
    used->len = pad + bytes;
    b->off += pad + bytes;
    b->len -= pad + bytes;
    if (b->len == 0) {
      *link = b->next;
      free(b);
    }
    used->next = ar->used;
    ar->used = used;
    pthread_mutex_unlock(&ar->lock);
    *ptr_p = ar->start + used->off;
    return 0;
  }
  pthread_mutex_unlock(&ar->lock);
  free(used);
  return -ENOMEM;
}

void coll_arena_free(coll_comm_t *c, void *ptr) {
  c = coll__comm_here(c);
  if (c == NULL || c->arena == NULL || ptr == NULL) return;
  coll__arena_t *ar = c->arena;
  size_t uoff = (size_t)((uint8_t *)ptr - ar->start);
  pthread_mutex_lock(&ar->lock);
  arena_block_t **link = &ar->used, *u = NULL;
  for (; *link; link = &(*link)->next)
    if ((*link)->off == uoff) {
      u = *link;
      *link = u->next;
      break;
    }
  if (u == NULL) { /* not ours: ignore rather than corrupt the list */
    pthread_mutex_unlock(&ar->lock);
    return;
  }
  u->off = uoff - u->pad; /* give the padding back too */
  /* insert u as a free block (sorted), then coalesce with neighbours */
  arena_block_t **pos = &ar->free_list;
  while (*pos && (*pos)->off < u->off) pos = &(*pos)->next;
  u->next = *pos;
  *pos = u;
  for (arena_block_t *b = ar->free_list; b && b->next;) {
    if (b->off + b->len == b->next->off) {
      arena_block_t *n = b->next;
      b->len += n->len;
      b->next = n->next;
      free(n);
    } else {
      b = b->next;
    }
  }
  pthread_mutex_unlock(&ar->lock);
}

int coll_arena_contains(const coll_comm_t *c, const void *ptr, size_t bytes) {
  return coll__arena_offset(coll__comm_here(c), ptr, bytes) != 0;
}

uint64_t coll__arena_offset(const coll_comm_t *c, const void *ptr, size_t bytes) {
  if (c == NULL || c->arena == NULL || ptr == NULL) return 0;
  const uint8_t *p = ptr, *s = c->arena->start;
  if (p < s || bytes > c->arena->bytes || (size_t)(p - s) > c->arena->bytes - bytes) return 0;
  return (uint64_t)(p - c->base);
}
