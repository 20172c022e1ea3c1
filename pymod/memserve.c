/*
 * memserve.c - hbmcoll._core.MemServe(bridge): a memory server's data path in C, without the
 * GIL (hbmcoll/memserver/server.py keeps the control path: tokens, opens, locks). Clients write requests
 * one-sided into their slot of the bridge's pool, two in flight, each in a half named by its
 * note; serve() applies them in the order of their numbers (write: copy; accumulate: y +=
 * alpha * x; read: copy out behind the version; commit: a staged write) and answers into the
 * same half of the client's reply slot. Which design, and why (hbmcoll/memserver/protocol.py tells it whole):
 * - A write or accumulate cut in chunks is gathered in its client's stage and applied at its
 *   last chunk, so its bytes are never visible half done and no reader waits for its writer;
 *   one whose next chunk is MS_PARTIAL_S late is dropped. A read cut in chunks holds the
 *   buffer (others park behind it) until its last chunk, or as long as its chunks keep coming.
 * - A write carries its dtype (refused unless the buffer's), its id, and the lock's fencing
 *   token when made under the lock: a token that is not the holder's within its lease (or is
 *   below one seen) is refused, so a holder that lost its lock writes nothing.
 * - A striped write's parts are staged whole (MS_STAGE) and then committed, part 0 first: once
 *   part 0 is in, a read of another part that names part 0's write id commits it there too, so
 *   a writer that stops between its commits leaves no torn buffer behind.
 * - A note counts only from the client it names (its sender, as the bridge reports it, is that
 *   client's peer): any other is dropped and counted (dropped()), so no one can push another
 *   client's requests or end it.
 * The protocol is hbmcoll/memserver/protocol.py's: protocol() gives the numbers for a test to compare.
 */
#include "core.h"

#include <poll.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "coll_internal.h" /* coll__axpy */
#include "net.h"

enum { MS_HEAD_BYTES = 64, MS_REPLY_BYTES = 16, MS_HALF = 1 << 19, MS_PENDING = 4 };
enum { MS_WRITE = 1, MS_ACCUMULATE = 2, MS_READ = 3, MS_COMMIT = 4 };
enum { MS_OK = 0, MS_REFUSED = 1, MS_FENCED = 2, MS_DTYPE = 3, MS_DROPPED = 4, MS_NOT_STAGED = 5 };
#define MS_MAGIC 0x53424D48u
#define MS_FIRST (1u << 8)
#define MS_LAST (1u << 9)
#define MS_STAGE (1u << 10)
#define MS_NUMBER ((1u << 28) - 1)
#define MS_REPLY_S 10.0  /* a reply that cannot leave for this long drops its client */
#define MS_PARTIAL_S 5.0 /* a request in chunks whose next chunk is this late is dropped */
#define MS_SWEEP_S 0.05  /* how often stuck replies and late chunks are looked for */

typedef struct { /* protocol.py's HEAD (hbmcoll/memserver/), "<IIQQQdQQQ": 64 bytes, no padding */
  uint32_t magic, opf;   /* opf: op | FIRST | LAST | STAGE | dtype code << 16 */
  uint64_t bid, off, length;
  double alpha;
  uint64_t number, fence, wid; /* fence: the lock's token, 0 without; wid: the write's id (a read's: a hint) */
} ms_head_t;

typedef struct {
  int client, half;
  ms_head_t head;
} ms_req_t;

typedef struct { /* a write or accumulate gathered chunk by chunk, applied whole at its last */
  int active;
  unsigned op;
  uint64_t bid, wid, fence;
  double alpha, last; /* last: when its latest chunk came */
  size_t lo, end, cap;
  uint8_t *data;
} ms_stage_t;

typedef struct { /* a striped write's part, staged whole, waiting for its commit */
  uint64_t wid, fence;
  size_t lo, len;
  uint8_t *data; /* NULL: a free entry */
} ms_pending_t;

typedef struct {
  int used, holder; /* holder: the client whose chunked read holds it, or -1 */
  int code;         /* protocol.py's DTYPES index */
  size_t base, nbytes, es;
  coll_dtype_t dtype; /* COLL_DTYPE_COUNT: read and write only */
  uint64_t version, wid, fence_max, lock_token;
  double lock_until, hold_last;
  ms_pending_t pending[MS_PENDING];
  ms_req_t *parked; /* waiting for the holder, in arrival order */
  int nparked, cap;
} ms_buf_t;

typedef struct {
  int used, peer, have_expected, nearly;
  size_t slot, reply, reply_to;
  uint64_t expected;
  ms_req_t early[2]; /* requests that overtook the one expected */
  ms_stage_t stage;
} ms_client_t;

typedef struct {
  PyObject_HEAD
  PyObject *bridge;
  coll__net_t *net;
  uint8_t *pool;
  ms_client_t *clients;
  int nclients;
  ms_buf_t *bufs; /* by id */
  int nbufs;
  int *dropped; /* clients dropped by a failed reply, for Python to close */
  int ndropped;
  double swept;
  uint64_t forged; /* notes not from the client they name (or from no known sender) */
} ms_t;

static void ms_apply(ms_t *s, int c, const ms_head_t *h, int half);
static void ms_unpark(ms_t *s, ms_buf_t *buf);

static void ms_drop(ms_t *s, int c) {
  ms_client_t *cl = &s->clients[c];
  if (!cl->used) return;
  cl->used = 0;
  free(cl->stage.data);
  cl->stage = (ms_stage_t){0};
  for (int b = 0; b < s->nbufs; b++) { /* all its parked requests go before any buffer unparks */
    ms_buf_t *buf = &s->bufs[b];
    int k = 0;
    for (int i = 0; i < buf->nparked; i++)
      if (buf->parked[i].client != c) buf->parked[k++] = buf->parked[i];
    buf->nparked = k;
  }
  for (int b = 0; b < s->nbufs; b++)
    if (s->bufs[b].used && s->bufs[b].holder == c) {
      s->bufs[b].holder = -1;
      ms_unpark(s, &s->bufs[b]);
    }
}

static void ms_reply(ms_t *s, int c, uint64_t number, uint32_t status, size_t nbytes, int half) {
  ms_client_t *cl = &s->clients[c];
  char err[320];
  coll__net_set_timeout(s->net, MS_REPLY_S);
  size_t at = (size_t)half * MS_HALF;
  if (coll__net_write(s->net, cl->peer, cl->reply + at, cl->reply_to + at, nbytes,
                      (status << 28) | ((uint32_t)number & MS_NUMBER), NULL, err, sizeof err) != 0) {
    if (s->ndropped <= s->nclients) s->dropped[s->ndropped++] = c; /* gone, or stopped so long that its answer cannot leave */
    ms_drop(s, c);
  }
}

/* The holder's next parked chunk, or anyone's once the buffer is free, in order. */
static void ms_unpark(ms_t *s, ms_buf_t *buf) {
  for (;;) {
    int i = 0;
    while (i < buf->nparked && buf->holder >= 0 && buf->parked[i].client != buf->holder) i++;
    if (i == buf->nparked) return;
    ms_req_t r = buf->parked[i];
    memmove(buf->parked + i, buf->parked + i + 1, (size_t)(--buf->nparked - i) * sizeof r);
    ms_apply(s, r.client, &r.head, r.half);
  }
}

static void ms_refuse(ms_t *s, int c, ms_buf_t *buf, uint64_t number, int half, uint32_t status) {
  ms_stage_t *st = &s->clients[c].stage;
  if (buf && st->active && st->bid == (uint64_t)(buf - s->bufs) + 1) st->active = 0; /* its chunks so far go */
  if (buf && buf->holder == c) { /* a chunked read ends here */
    buf->holder = -1;
    ms_unpark(s, buf);
  }
  if (s->clients[c].used) ms_reply(s, c, number, status, MS_REPLY_BYTES, half);
}

/* Fencing: 0 when a request carrying the lock's token `fence` may change the buffer. The server
 * that grants the buffer's lock takes only the holder's token within its lease; the others
 * (a striped buffer's later parts) take any token but one below the highest they have seen. */
static int ms_fenced(ms_buf_t *buf, uint64_t fence) {
  if (fence == 0) return 0; /* a write without the lock: allowed, unfenced */
  if (fence < buf->fence_max) return -1;
  if (buf->lock_token && (fence != buf->lock_token || hb_now() > buf->lock_until)) return -1;
  buf->fence_max = fence;
  return 0;
}

static void ms_pending_free(ms_pending_t *p) {
  free(p->data);
  *p = (ms_pending_t){0};
}

/* A staged write (a striped write's part) becomes the buffer's contents; the staged writes of
 * older tokens go with it (their holders lost the lock, or this write follows theirs). */
static void ms_commit(ms_buf_t *buf, uint8_t *y0, ms_pending_t *p) {
  memcpy(y0 + p->lo, p->data, p->len);
  buf->version++, buf->wid = p->wid;
  uint64_t fence = p->fence;
  for (int i = 0; i < MS_PENDING; i++)
    if (buf->pending[i].data && buf->pending[i].fence <= fence) ms_pending_free(&buf->pending[i]);
}

static ms_pending_t *ms_pending_find(ms_buf_t *buf, uint64_t wid) {
  for (int i = 0; wid && i < MS_PENDING; i++)
    if (buf->pending[i].data && buf->pending[i].wid == wid) return &buf->pending[i];
  return NULL;
}

/* A chunk of a write or accumulate into the client's stage: MS_OK, or why it is refused. */
static uint32_t ms_stage_chunk(ms_stage_t *st, const ms_head_t *h, const uint8_t *data) {
  unsigned op = h->opf & 0xFF;
  if (h->opf & MS_FIRST) {
    *st = (ms_stage_t){.active = 1, .op = op, .bid = h->bid, .wid = h->wid, .fence = h->fence,
                       .alpha = h->alpha, .lo = h->off, .end = h->off, .cap = st->cap, .data = st->data};
  } else if (!st->active || st->bid != h->bid || st->op != op || st->wid != h->wid || st->end != h->off) {
    st->active = 0;
    return MS_DROPPED; /* its earlier chunks were refused, or dropped as too late */
  }
  if (st->end - st->lo + h->length > st->cap) {
    size_t cap = st->cap ? st->cap : MS_HALF;
    while (cap < st->end - st->lo + h->length) cap *= 2;
    uint8_t *d = realloc(st->data, cap);
    if (d == NULL) return st->active = 0, MS_REFUSED;
    st->data = d, st->cap = cap;
  }
  memcpy(st->data + (st->end - st->lo), data, h->length);
  st->end += h->length, st->last = hb_now();
  return MS_OK;
}

static void ms_apply(ms_t *s, int c, const ms_head_t *h, int half) {
  ms_client_t *cl = &s->clients[c];
  ms_buf_t *buf = h->bid >= 1 && h->bid <= (uint64_t)s->nbufs && s->bufs[h->bid - 1].used ? &s->bufs[h->bid - 1] : NULL;
  unsigned op = h->opf & 0xFF, first = h->opf & MS_FIRST, last = h->opf & MS_LAST;
  uint8_t *data = s->pool + cl->slot + (size_t)half * MS_HALF + MS_HEAD_BYTES;
  uint8_t *reply = s->pool + cl->reply + (size_t)half * MS_HALF;
  if (h->magic != MS_MAGIC || buf == NULL || op < MS_WRITE || op > MS_COMMIT || h->length > MS_HALF - MS_HEAD_BYTES ||
      h->off > buf->nbytes || h->length > buf->nbytes - h->off)
    return ms_refuse(s, c, buf, h->number, half, MS_REFUSED);
  if (buf->holder >= 0 && buf->holder != c) { /* after the holder's last chunk */
    if (buf->nparked == buf->cap) {
      int cap = buf->cap ? 2 * buf->cap : 8;
      ms_req_t *p = realloc(buf->parked, (size_t)cap * sizeof *p);
      if (p == NULL) return ms_refuse(s, c, NULL, h->number, half, MS_REFUSED);
      buf->parked = p, buf->cap = cap;
    }
    buf->parked[buf->nparked++] = (ms_req_t){c, half, *h};
    return;
  }
  uint8_t *y0 = s->pool + buf->base;
  if (op == MS_READ) {
    if (!first && buf->holder != c) /* its earlier chunk was refused, or it stalled past the deadline */
      return ms_refuse(s, c, buf, h->number, half, MS_DROPPED);
    ms_pending_t *p = first && h->wid != buf->wid ? ms_pending_find(buf, h->wid) : NULL;
    if (p) ms_commit(buf, y0, p); /* a striped write whose first part is in: this part follows it */
    memcpy(reply + MS_REPLY_BYTES, y0 + h->off, h->length);
    buf->holder = last ? -1 : c, buf->hold_last = hb_now();
  } else {
    if (op != MS_COMMIT && ((int)((h->opf >> 16) & 0xFF) != buf->code || h->off % buf->es || h->length % buf->es))
      return ms_refuse(s, c, buf, h->number, half, MS_DTYPE); /* never reinterpret another dtype's bits */
    if (ms_fenced(buf, h->fence)) return ms_refuse(s, c, buf, h->number, half, MS_FENCED);
    if (op == MS_COMMIT) {
      ms_pending_t *p = ms_pending_find(buf, h->wid);
      if (p) ms_commit(buf, y0, p);
      else if (buf->wid != h->wid) return ms_refuse(s, c, buf, h->number, half, MS_NOT_STAGED);
    } else if (first && last && !(h->opf & MS_STAGE)) { /* one chunk: applied as it is */
      if (op == MS_WRITE) memcpy(y0 + h->off, data, h->length), buf->wid = h->wid;
      else if (buf->dtype == COLL_DTYPE_COUNT ||
               coll__axpy(buf->dtype, y0 + h->off, data, h->alpha, h->length / buf->es))
        return ms_refuse(s, c, buf, h->number, half, MS_REFUSED); /* no accumulate of this dtype, or alpha */
      buf->version++;
    } else {
      ms_stage_t *st = &cl->stage;
      uint32_t status = ms_stage_chunk(st, h, data);
      if (status != MS_OK) return ms_refuse(s, c, buf, h->number, half, status);
      if (last && (h->opf & MS_STAGE)) { /* kept for its commit; the oldest token's entry makes room */
        ms_pending_t *p = &buf->pending[0];
        for (int i = 1; i < MS_PENDING && p->data; i++)
          if (!buf->pending[i].data || buf->pending[i].fence < p->fence) p = &buf->pending[i];
        ms_pending_free(p);
        *p = (ms_pending_t){.wid = st->wid, .fence = st->fence, .lo = st->lo, .len = st->end - st->lo,
                            .data = st->data};
        st->data = NULL, st->cap = 0, st->active = 0;
      } else if (last) {
        st->active = 0;
        if (st->op == MS_WRITE) memcpy(y0 + st->lo, st->data, st->end - st->lo), buf->wid = st->wid;
        else if (buf->dtype == COLL_DTYPE_COUNT ||
                 coll__axpy(buf->dtype, y0 + st->lo, st->data, st->alpha, (st->end - st->lo) / buf->es))
          return ms_refuse(s, c, buf, h->number, half, MS_REFUSED);
        buf->version++;
      }
    }
  }
  memcpy(reply, &buf->version, 8);
  memcpy(reply + 8, &buf->wid, 8);
  ms_reply(s, c, h->number, MS_OK, MS_REPLY_BYTES + (op == MS_READ ? h->length : 0), half);
  if (buf->holder < 0) ms_unpark(s, buf);
}

/* Deadlines: a chunked write whose next chunk is MS_PARTIAL_S late is dropped (it was never
 * visible), and a chunked read as late gives the buffer back to the requests parked on it. */
static void ms_sweep(ms_t *s, double now) {
  for (int c = 0; c < s->nclients; c++)
    if (s->clients[c].used && s->clients[c].stage.active && now - s->clients[c].stage.last > MS_PARTIAL_S)
      s->clients[c].stage.active = 0;
  for (int b = 0; b < s->nbufs; b++)
    if (s->bufs[b].used && s->bufs[b].holder >= 0 && now - s->bufs[b].hold_last > MS_PARTIAL_S) {
      s->bufs[b].holder = -1;
      ms_unpark(s, &s->bufs[b]);
    }
}

/* A note that does not come from the client it names: dropped, counted, said once. */
static void ms_forged(ms_t *s, int c, int peer) {
  if (s->forged++ == 0) {
    char line[200];
    int len = snprintf(line, sizeof line, "hbmcoll: the memory server dropped a note naming client %d from %s; "
                       "such notes are counted and not said again\n", c, peer < 0 ? "an unknown sender" :
                       "another client");
    if (len > 0 && write(2, line, (size_t)len < sizeof line ? (size_t)len : sizeof line - 1) < 0) {
      /* nowhere to report a failed warning */
    }
  }
}

/* A client's note (peer: its sender's peer number, -1 unknown): its request goes in order of the
 * numbers. */
static void ms_note(ms_t *s, uint32_t note, int peer) {
  int c = (int)(note & 0xFFFF), half = (int)((note >> 16) & 1);
  if (c >= s->nclients || !s->clients[c].used || peer < 0 || s->clients[c].peer != peer) return ms_forged(s, c, peer);
  ms_client_t *cl = &s->clients[c];
  if (cl->nearly == 2) { /* more in flight than the protocol lets a client have */
    if (s->ndropped <= s->nclients) s->dropped[s->ndropped++] = c;
    return ms_drop(s, c);
  }
  ms_req_t *r = &cl->early[cl->nearly++];
  r->client = c, r->half = half;
  memcpy(&r->head, s->pool + cl->slot + (size_t)half * MS_HALF, sizeof r->head);
  if (!cl->have_expected) cl->have_expected = 1, cl->expected = r->head.number;
  for (int found = 1; found && cl->used;) {
    found = 0;
    for (int i = 0; i < cl->nearly; i++)
      if (cl->early[i].head.number == cl->expected) {
        ms_req_t go = cl->early[i];
        cl->early[i] = cl->early[--cl->nearly];
        cl->expected = (cl->expected + 1) & MS_NUMBER;
        ms_apply(s, c, &go.head, go.half);
        found = 1;
        break;
      }
  }
}

/* serve(fds, timeout): apply requests until one of fds (the control sockets) is readable or
 * timeout seconds passed; the clients dropped meanwhile (their answers could not leave). */
static PyObject *ms_serve(ms_t *s, PyObject *args) {
  PyObject *fdlist;
  double timeout;
  if (!PyArg_ParseTuple(args, "O!d", &PyList_Type, &fdlist, &timeout)) return NULL;
  Py_ssize_t nfds = PyList_GET_SIZE(fdlist);
  struct pollfd *fds = calloc((size_t)nfds + 1, sizeof *fds);
  if (fds == NULL) return PyErr_NoMemory();
  for (Py_ssize_t i = 0; i < nfds; i++) {
    fds[i].fd = (int)PyLong_AsLong(PyList_GET_ITEM(fdlist, i));
    fds[i].events = POLLIN;
  }
  if (PyErr_Occurred()) {
    free(fds);
    return NULL;
  }
  s->ndropped = 0;
  Py_BEGIN_ALLOW_THREADS
  double until = hb_now() + timeout, since = 0;
  char err[320];
  for (unsigned spins = 1;; spins++) {
    uint32_t note;
    int peer;
    int rc = coll__net_poll_from(s->net, &note, &peer, err, sizeof err);
    if (rc == 1) {
      ms_note(s, note, peer);
      since = 0;
      if (s->ndropped) break; /* Python closes their sockets */
      continue;
    } /* rc < 0: a transfer to a client that went away failed; its control socket says so */
    /* a short spin, then a sleep in the kernel that a request, a control socket, the next
     * sweep or the timeout ends (coll__net_idle_fds) */
    double sweep = s->swept + MS_SWEEP_S;
    int slept = coll__net_idle_fds(s->net, &since, until < sweep ? until : sweep, fds, (int)nfds);
    if (!slept && (spins & 15)) continue;
    double now = hb_now();
    if (now - s->swept > MS_SWEEP_S) {
      s->swept = now;
      ms_sweep(s, now);
      if (s->ndropped) break;
    }
    if (now > until || (nfds && poll(fds, (nfds_t)nfds, 0) > 0)) break;
  }
  Py_END_ALLOW_THREADS
  free(fds);
  PyObject *out = PyList_New(s->ndropped);
  for (int i = 0; out && i < s->ndropped; i++) PyList_SET_ITEM(out, i, PyLong_FromLong(s->dropped[i]));
  return out;
}

static PyObject *ms_add_client(ms_t *s, PyObject *args) {
  int c, peer;
  Py_ssize_t slot, reply, reply_to;
  if (!PyArg_ParseTuple(args, "iinnn", &c, &peer, &slot, &reply, &reply_to)) return NULL;
  size_t pool = coll__net_pool_bytes(s->net);
  if (c < 0 || c >= s->nclients || slot < 0 || reply < 0 || reply_to < 0 || (size_t)slot + 2 * MS_HALF > pool ||
      (size_t)reply + 2 * MS_HALF > pool)
    return hb_bad_arg("add_client: client %d's slots do not fit", c);
  s->clients[c] = (ms_client_t){.used = 1, .peer = peer, .slot = (size_t)slot, .reply = (size_t)reply,
                                .reply_to = (size_t)reply_to};
  Py_RETURN_NONE;
}

static PyObject *ms_drop_client(ms_t *s, PyObject *args) {
  int c;
  if (!PyArg_ParseTuple(args, "i", &c)) return NULL;
  if (c >= 0 && c < s->nclients) {
    s->ndropped = 0;
    ms_drop(s, c);
  }
  Py_RETURN_NONE;
}

/* add_buffer(id, base, nbytes, dtype name, dtype code, itemsize): a dtype libcoll does not
 * know (bool, uint16, complex64, ...) is read and written, not accumulated. */
static PyObject *ms_add_buffer(ms_t *s, PyObject *args) {
  int id, code;
  Py_ssize_t base, nbytes, es;
  const char *name;
  if (!PyArg_ParseTuple(args, "innsin", &id, &base, &nbytes, &name, &code, &es)) return NULL;
  if (id != s->nbufs + 1 || code < 1 || code > 0xFF || es < 1 || base < 0 || nbytes < 0 || nbytes % es ||
      (size_t)base + (size_t)nbytes > coll__net_pool_bytes(s->net))
    return hb_bad_arg("add_buffer: buffer %d (%s) does not fit", id, name);
  ms_buf_t *b = realloc(s->bufs, (size_t)id * sizeof *b);
  if (b == NULL) return PyErr_NoMemory();
  s->bufs = b, s->nbufs = id;
  b[id - 1] = (ms_buf_t){.used = 1, .holder = -1, .code = code, .base = (size_t)base, .nbytes = (size_t)nbytes,
                         .es = (size_t)es, .dtype = hb_dtype_named(name)};
  Py_RETURN_NONE;
}

/* set_fence(id, token, lease): the buffer's lock is granted with token for lease seconds (0:
 * given back); from now on only that token, within the lease, changes it with a fence. */
static PyObject *ms_set_fence(ms_t *s, PyObject *args) {
  int id;
  unsigned long long token;
  double lease;
  if (!PyArg_ParseTuple(args, "iKd", &id, &token, &lease)) return NULL;
  if (id < 1 || id > s->nbufs || token == 0) return hb_bad_arg("set_fence: no buffer %d, or token 0", id);
  ms_buf_t *b = &s->bufs[id - 1];
  b->lock_token = token, b->lock_until = lease > 0 ? hb_now() + lease : 0;
  if (token > b->fence_max) b->fence_max = token;
  Py_RETURN_NONE;
}

static PyObject *ms_version(ms_t *s, PyObject *args) {
  int id;
  if (!PyArg_ParseTuple(args, "i", &id)) return NULL;
  if (id < 1 || id > s->nbufs) return hb_bad_arg("no buffer %d", id);
  return Py_BuildValue("KK", (unsigned long long)s->bufs[id - 1].version, (unsigned long long)s->bufs[id - 1].wid);
}

static PyObject *ms_forged_count(ms_t *s, PyObject *unused) {
  (void)unused;
  return PyLong_FromUnsignedLongLong(s->forged);
}

static PyObject *ms_protocol(PyObject *cls, PyObject *unused) {
  (void)cls, (void)unused;
  return Py_BuildValue("{s:i,s:i,s:i,s:I,s:I,s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:i,s:d,s:(iiiiii)}", "HEAD_BYTES",
                       MS_HEAD_BYTES, "REPLY_BYTES", MS_REPLY_BYTES, "HALF", MS_HALF, "MAGIC", MS_MAGIC, "FIRST",
                       MS_FIRST, "LAST", MS_LAST, "STAGE", MS_STAGE, "NUMBER", MS_NUMBER, "WRITE", MS_WRITE,
                       "ACCUMULATE", MS_ACCUMULATE, "READ", MS_READ, "COMMIT", MS_COMMIT, "HEAD_STRUCT_BYTES",
                       (int)sizeof(ms_head_t), "PARTIAL_S", MS_PARTIAL_S, "STATUS", MS_OK, MS_REFUSED, MS_FENCED,
                       MS_DTYPE, MS_DROPPED, MS_NOT_STAGED);
}

static PyObject *ms_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *names[] = {"bridge", "max_clients", NULL};
  PyObject *bridge;
  int max_clients;
  hb_state_t *st = PyType_GetModuleState(type);
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!i", names, st->BridgeType, &bridge, &max_clients)) return NULL;
  if (max_clients < 1 || max_clients > 0xFFFF) return hb_bad_arg("max_clients %d: 1 to 65535", max_clients);
  coll__net_t *net = hb_bridge_net(bridge);
  if (net == NULL) return hb_raise(st, COLL_EABORTED, "the bridge is closed");
  ms_t *s = (ms_t *)type->tp_alloc(type, 0);
  if (s == NULL) return NULL;
  s->clients = calloc((size_t)max_clients, sizeof *s->clients);
  s->dropped = calloc((size_t)max_clients + 1, sizeof *s->dropped);
  if (s->clients == NULL || s->dropped == NULL) {
    Py_DECREF(s);
    return PyErr_NoMemory();
  }
  s->bridge = Py_NewRef(bridge), s->net = net, s->pool = coll__net_pool(net), s->nclients = max_clients;
  return (PyObject *)s;
}

static void ms_dealloc(ms_t *s) {
  PyTypeObject *tp = Py_TYPE(s);
  PyObject_GC_UnTrack(s);
  for (int b = 0; b < s->nbufs; b++) {
    free(s->bufs[b].parked);
    for (int i = 0; i < MS_PENDING; i++) free(s->bufs[b].pending[i].data);
  }
  for (int c = 0; s->clients && c < s->nclients; c++) free(s->clients[c].stage.data);
  free(s->bufs), free(s->clients), free(s->dropped);
  Py_CLEAR(s->bridge);
  tp->tp_free(s);
  Py_DECREF(tp);
}

static int ms_traverse(ms_t *s, visitproc visit, void *arg) {
  Py_VISIT(Py_TYPE(s));
  Py_VISIT(s->bridge);
  return 0;
}

static PyMethodDef ms_methods[] = {
    {"serve", (PyCFunction)ms_serve, METH_VARARGS, "serve(fds, timeout) -> clients dropped"},
    {"add_client", (PyCFunction)ms_add_client, METH_VARARGS, "add_client(index, peer, slot, reply, reply_to)"},
    {"drop_client", (PyCFunction)ms_drop_client, METH_VARARGS, "drop_client(index)"},
    {"add_buffer", (PyCFunction)ms_add_buffer, METH_VARARGS, "add_buffer(id, base, nbytes, dtype, code, itemsize)"},
    {"set_fence", (PyCFunction)ms_set_fence, METH_VARARGS, "set_fence(id, token, lease): the lock's grant"},
    {"version", (PyCFunction)ms_version, METH_VARARGS, "version(id) -> (version, the last write's id)"},
    {"dropped", (PyCFunction)ms_forged_count, METH_NOARGS, "notes dropped: not from the client they name"},
    {"protocol", (PyCFunction)ms_protocol, METH_NOARGS | METH_STATIC, "the protocol's numbers (hbmcoll/memserver/protocol.py's)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot ms_slots[] = {{Py_tp_new, ms_new},           {Py_tp_dealloc, ms_dealloc},
                                 {Py_tp_traverse, ms_traverse}, {Py_tp_methods, ms_methods},
                                 {0, NULL}};

PyType_Spec hb_memserve_spec = {"hbmcoll._core.MemServe", sizeof(ms_t), 0,
                                Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_IMMUTABLETYPE, ms_slots};
