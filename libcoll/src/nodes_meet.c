/*
 * nodes_meet.c - the rendezvous of nodes: member 0 listens on TCP at
 * (addr, port); every other member connects, and both sides prove they hold the job's secret
 * before anything else crosses (HMAC-SHA256 over fresh nonces of both, so neither the secret nor a
 * replayable answer is ever sent). The member that connects proves first: a stranger who connects
 * to member 0 gets a nonce and nothing keyed, so it has nothing to guess a weak secret against
 * offline (only one who took member 0's address could get a proof). A member sends its blob only
 * to a member 0 that proved itself; once complete() says all came, member 0 answers every member
 * with all blobs, or with the one error that ends the job. A peer that cannot prove the secret is
 * refused and never sees a blob. Member 0 serves every connection at once (one poll), each with
 * its own deadline and size limit: a stranger that connects and says nothing is dropped and delays
 * nobody, and one that connects non-stop pushes out its own handshakes (meet_crowding). The
 * connections stay open (nodes_watch.c).
 *
 *   member k -> 0: MAGIC, k (u32), nonce_k (32 B)
 *   0 -> k:        nonce_0
 *   k -> 0:        HMAC(secret, "client" nonce_0 nonce_k MAGIC k)
 *   0 -> k:        'P', HMAC(secret, "server" nonce_k nonce_0); or 'R' and 32 zero bytes (refused)
 *   k -> 0:        len (u32), blob, HMAC(secret, "blob" nonce_0 nonce_k MAGIC k blob)
 *   0 -> k:        len (u32), then 'O' and every (member u32, len u32, blob), or 'E' and a sentence
 * Integers are big-endian. The magic ("HBMC2") changes with the blobs' format or the exchange, so
 * nodes that cannot read each other are refused at once instead of misreading each other. Member 0
 * may be handed a socket that listens already (how->listener: the Python package's groups pick
 * their own ports).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "nodes.h"

#define MEET_MAGIC "HBMC2"
#define MEET_MAGIC_LEN 6 /* with its NUL */
#define MEET_NONCE 32
#define MEET_HEAD (MEET_MAGIC_LEN + 4 + MEET_NONCE)
#define MEET_BLOB_LIMIT (1 << 16)
#define MEET_VERDICT_LIMIT (1 << 24)
#define MEET_HANDSHAKE_S 10.0
#define MEET_MAX_SHAKES 64
#define MEET_SAY_MISSING_S 10.0
#define MEET_KEEPALIVE_S 5

static double meet_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void meet_put32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24), p[1] = (uint8_t)(v >> 16), p[2] = (uint8_t)(v >> 8), p[3] = (uint8_t)v;
}
static uint32_t meet_get32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* A node whose link is down leaves its connections open but silent: keepalive ends them. */
static void meet_keepalive(int fd) {
  int on = 1, idle = MEET_KEEPALIVE_S, intvl = 1, cnt = 5;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

static void meet_proof(const char *secret, const char *side, const uint8_t *a, const uint8_t *b,
                       const uint8_t *head, const uint8_t *blob, size_t len, uint8_t out[32]) {
  const void *parts[5] = {side, a, b, head, blob};
  size_t lens[5] = {strlen(side), MEET_NONCE, MEET_NONCE, MEET_MAGIC_LEN + 4, len};
  coll__hmac_sha256((const uint8_t *)secret, strlen(secret), parts, lens, head ? 5 : 3, out);
}

static int meet_same(const uint8_t *a, const uint8_t *b, size_t n) { /* in constant time */
  uint8_t d = 0;
  for (size_t i = 0; i < n; i++) d |= a[i] ^ b[i];
  return d == 0;
}

/* Wait for fd (POLLIN or POLLOUT) until deadline (0: none), checking the interrupt. */
static int meet_wait(int fd, short ev, double deadline, const coll__nodes_meet_t *how) {
  for (;;) {
    double left = deadline > 0 ? deadline - meet_now() : 1.0;
    if (left <= 0) return -ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = ev};
    int rc = poll(&p, 1, (int)(fmin(left, 0.05) * 1000) + 1);
    if (rc > 0) return 0;
    if (rc < 0 && errno != EINTR) return -errno;
    if (how->interrupt && how->interrupt(how->interrupt_arg)) return COLL_EINTERRUPTED;
  }
}

static int meet_recv(int fd, void *buf, size_t n, double deadline, const coll__nodes_meet_t *how) {
  uint8_t *p = buf;
  while (n) {
    int rc = meet_wait(fd, POLLIN, deadline, how);
    if (rc) return rc;
    ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got == 0) return -ECONNRESET;
    if (got < 0 && errno != EAGAIN && errno != EINTR) return -errno;
    if (got > 0) p += got, n -= (size_t)got;
  }
  return 0;
}

static int meet_send(int fd, const void *buf, size_t n) {
  const uint8_t *p = buf;
  while (n) {
    ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) return -errno;
    p += put, n -= (size_t)put;
  }
  return 0;
}

void coll__nodes_blobs_free(coll__nodes_blob_t *blobs, int n) {
  for (int i = 0; blobs && i < n; i++) free(blobs[i].blob);
  free(blobs);
}

static int meet_cmp(const void *x, const void *y) {
  const coll__nodes_blob_t *a = x, *b = y;
  return (a->member > b->member) - (a->member < b->member);
}

int coll__nodes_members_complete(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len) {
  int want = *(const int *)arg;
  for (int i = 0; i < n; i++)
    if (blobs[i].member >= want) {
      snprintf(text, len, "a member numbered %d came to a rendezvous of %d", blobs[i].member, want);
      return COLL_EBOOTSTRAP;
    }
  return n == want;
}

void coll__nodes_members_who(void *arg, const coll__nodes_blob_t *blobs, int n, char *text, size_t len) {
  int want = *(const int *)arg, used = snprintf(text, len, "%d of %d members came; missing: members", n, want);
  for (int m = 0; m < want && used > 0 && (size_t)used < len; m++) {
    int came = 0;
    for (int i = 0; i < n; i++) came |= blobs[i].member == m;
    if (!came) used += snprintf(text + used, len - (size_t)used, " %d", m);
  }
}

/* ---- member 0 ---- */
typedef struct {
  int fd;
  double deadline;
  uint8_t *got;
  size_t len, cap;
  int step; /* 1: member 0's nonce went out; 2: its proof too (the member proved the secret) */
  uint8_t nonce[MEET_NONCE];
  char peer[64];
  char group[64]; /* the address whose handshakes are counted together: an IPv6 one's /64 */
} meet_shake_t;

typedef struct {
  const char *where, *secret;
  const coll__nodes_meet_t *how;
  coll__nodes_blob_t *blobs;
  int n;
  int *socks;
  meet_shake_t shakes[MEET_MAX_SHAKES];
  int nshakes;
  char refused[160], refused_why[120];
} meet_serve_t;

static void meet_drop(meet_serve_t *s, int k, const char *why) {
  meet_shake_t *h = &s->shakes[k];
  if (why && strstr(why, "secret") && !strstr(s->refused, h->peer)) {
    size_t used = strlen(s->refused);
    snprintf(s->refused + used, sizeof s->refused - used, "%s%s", used ? ", " : "", h->peer);
    snprintf(s->refused_why, sizeof s->refused_why, "%s", why);
  }
  if (h->fd >= 0) close(h->fd);
  free(h->got);
  s->shakes[k] = s->shakes[--s->nshakes];
}

static void meet_refused(const meet_serve_t *s, char *out, size_t len) {
  out[0] = '\0';
  if (s->refused[0] && snprintf(out, len, "; refused connections from %s: %s", s->refused, s->refused_why) >= (int)len)
    out[len - 1] = '\0'; /* cut to fit */
}

/* The handshake that goes for a newcomer from group when all are taken: the oldest of the group
 * holding the most (the newcomer counted), so a stranger connecting non-stop pushes out its own
 * connections, not the members'; -1: the newcomer itself (every group holds one). A member that
 * proved the secret is neither counted nor pushed out. */
static int meet_crowding(const meet_serve_t *s, const char *group) {
  int most = 1, victim = -1; /* the newcomer's own count, at least */
  for (int k = 0; k < s->nshakes; k++) {
    if (s->shakes[k].step == 2) continue;
    int held = strcmp(group, s->shakes[k].group) == 0, oldest = k;
    for (int j = 0; j < s->nshakes; j++)
      if (s->shakes[j].step != 2 && strcmp(s->shakes[j].group, s->shakes[k].group) == 0) {
        held++;
        if (s->shakes[j].deadline < s->shakes[oldest].deadline) oldest = j;
      }
    if (held > most) most = held, victim = oldest;
  }
  return victim;
}

static void meet_accept(meet_serve_t *s, int srv) {
  struct sockaddr_storage from;
  socklen_t fl = sizeof from;
  char peer[64], group[64];
  int fd = accept4(srv, (struct sockaddr *)&from, &fl, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return; /* out of descriptors, say: the others come again later */
  if (from.ss_family == AF_INET6) {
    struct in6_addr net = ((struct sockaddr_in6 *)&from)->sin6_addr;
    inet_ntop(AF_INET6, &net, peer, sizeof peer);
    memset(net.s6_addr + 8, 0, 8); /* one host may hold a whole /64 */
    inet_ntop(AF_INET6, &net, group, sizeof group);
  } else {
    inet_ntop(AF_INET, &((struct sockaddr_in *)&from)->sin_addr, peer, sizeof peer);
    snprintf(group, sizeof group, "%s", peer);
  }
  if (s->nshakes >= MEET_MAX_SHAKES) { /* a flood: members connect again */
    int victim = meet_crowding(s, group);
    if (victim < 0) {
      close(fd);
      return;
    }
    meet_drop(s, victim, NULL);
  }
  meet_keepalive(fd);
  meet_shake_t *h = &s->shakes[s->nshakes++];
  memset(h, 0, sizeof *h);
  h->fd = fd, h->deadline = meet_now() + MEET_HANDSHAKE_S;
  snprintf(h->peer, sizeof h->peer, "%s", peer);
  snprintf(h->group, sizeof h->group, "%s", group);
}

/* Feed connection k what came: 1 when it proved the secret and its blob is in, 0 while more
 * must come, -1 when it was dropped. */
static int meet_feed(meet_serve_t *s, int k) {
  meet_shake_t *h = &s->shakes[k];
  if (h->cap - h->len < 65536) {
    size_t cap = h->cap ? h->cap * 2 : 65536 + MEET_HEAD + 68;
    uint8_t *p = realloc(h->got, cap);
    if (p == NULL) return meet_drop(s, k, NULL), -1;
    h->got = p, h->cap = cap;
  }
  ssize_t got = recv(h->fd, h->got + h->len, h->cap - h->len, MSG_DONTWAIT);
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return 0;
  if (got <= 0) return meet_drop(s, k, NULL), -1;
  h->len += (size_t)got;
  if (h->len < MEET_HEAD) return 0;
  const uint8_t *nonce_k = h->got + MEET_MAGIC_LEN + 4, *rest = h->got + MEET_HEAD;
  size_t have = h->len - MEET_HEAD;
  if (h->step == 0) { /* a nonce, and nothing keyed: the one who connects proves first */
    if (memcmp(h->got, MEET_MAGIC, MEET_MAGIC_LEN) != 0) return meet_drop(s, k, NULL), -1;
    if (getrandom(h->nonce, MEET_NONCE, 0) != MEET_NONCE) return meet_drop(s, k, NULL), -1;
    if (meet_send(h->fd, h->nonce, MEET_NONCE) != 0) return meet_drop(s, k, NULL), -1;
    h->step = 1;
  }
  if (have < 32) return 0;
  uint8_t want[32], answer[1 + 32] = {'R'};
  if (h->step == 1) {
    meet_proof(s->secret, "client", h->nonce, nonce_k, h->got, (const uint8_t *)"", 0, want);
    if (!meet_same(want, rest, 32)) {
      (void)meet_send(h->fd, answer, sizeof answer); /* told, so it does not wait for its timeout */
      return meet_drop(s, k, "it does not hold the job's secret (another HBMCOLL_JOB_KEY?)"), -1;
    }
    answer[0] = 'P';
    meet_proof(s->secret, "server", nonce_k, h->nonce, NULL, NULL, 0, answer + 1);
    if (meet_send(h->fd, answer, sizeof answer) != 0) return meet_drop(s, k, NULL), -1;
    h->step = 2;
  }
  if (have < 36) return 0;
  uint32_t n = meet_get32(rest + 32);
  if (n > MEET_BLOB_LIMIT || have > 68 + (size_t)n) return meet_drop(s, k, NULL), -1;
  if (have < 68 + (size_t)n) return 0;
  meet_proof(s->secret, "blob", h->nonce, nonce_k, h->got, rest + 36, n, want);
  if (!meet_same(want, rest + 36 + n, 32)) return meet_drop(s, k, NULL), -1; /* not the member that proved */
  int member = (int)meet_get32(h->got + MEET_MAGIC_LEN);
  for (int i = 0; i < s->n; i++)
    if (s->blobs[i].member == member) return meet_drop(s, k, NULL), -1; /* came twice */
  uint8_t *blob = malloc(n + 1);
  coll__nodes_blob_t *more = realloc(s->blobs, (size_t)(s->n + 1) * sizeof *more);
  int *socks = realloc(s->socks, (size_t)(s->n + 1) * sizeof *socks);
  if (more) s->blobs = more;
  if (socks) s->socks = socks;
  if (!blob || !more || !socks) return free(blob), meet_drop(s, k, NULL), -1;
  memcpy(blob, rest + 36, n);
  s->blobs[s->n] = (coll__nodes_blob_t){.member = member, .blob = blob, .len = n};
  s->socks[s->n - 1] = h->fd; /* blobs[0] is member 0's own */
  s->n++;
  h->fd = -1;
  meet_drop(s, k, NULL);
  return 1;
}

static uint8_t *meet_pack(const coll__nodes_blob_t *blobs, int n, size_t *len_p) {
  size_t len = 1;
  for (int i = 0; i < n; i++) len += 8 + blobs[i].len;
  uint8_t *out = malloc(len), *p = out;
  if (out == NULL) return NULL;
  *p++ = 'O';
  for (int i = 0; i < n; i++) {
    meet_put32(p, (uint32_t)blobs[i].member), meet_put32(p + 4, (uint32_t)blobs[i].len);
    memcpy(p + 8, blobs[i].blob, blobs[i].len);
    p += 8 + blobs[i].len;
  }
  *len_p = len;
  return out;
}

static int meet_unpack(const uint8_t *p, size_t len, coll__nodes_blob_t **blobs_p, int *n_p) {
  coll__nodes_blob_t *blobs = NULL;
  int n = 0;
  for (size_t at = 0; at < len;) {
    if (len - at < 8 || meet_get32(p + at + 4) > len - at - 8) return coll__nodes_blobs_free(blobs, n), COLL_EBOOTSTRAP;
    size_t bl = meet_get32(p + at + 4);
    coll__nodes_blob_t *more = realloc(blobs, (size_t)(n + 1) * sizeof *more);
    uint8_t *b = malloc(bl + 1);
    if (more) blobs = more;
    if (!more || !b) return free(b), coll__nodes_blobs_free(blobs, n), -ENOMEM;
    memcpy(b, p + at + 8, bl);
    blobs[n++] = (coll__nodes_blob_t){.member = (int)meet_get32(p + at), .blob = b, .len = bl};
    at += 8 + bl;
  }
  *blobs_p = blobs, *n_p = n;
  return 0;
}

static int meet_serve(meet_serve_t *s, int srv, double deadline, char *err, size_t errlen) {
  const coll__nodes_meet_t *how = s->how;
  double started = meet_now();
  int told = 0, verdict = 0;
  char text[COLL__NODES_TEXT] = "", who[COLL__NODES_TEXT / 2], refused[300];
  while (verdict == 0) {
    double now = meet_now();
    if (deadline > 0 && now >= deadline) {
      how->who(how->arg, s->blobs, s->n, who, sizeof who);
      meet_refused(s, refused, sizeof refused);
      snprintf(err, errlen, "member 0 waited at %s for the other nodes %.0f s: %s%s; is every node started, "
               "with the same HBMCOLL_JOB_KEY, master address and port?", s->where, now - started, who, refused);
      return COLL_EBOOTSTRAP;
    }
    if (!told && now - started >= MEET_SAY_MISSING_S) {
      char line[COLL__NODES_TEXT + 200];
      told = 1;
      how->who(how->arg, s->blobs, s->n, who, sizeof who);
      meet_refused(s, refused, sizeof refused);
      snprintf(line, sizeof line, "hbmcoll: the rendezvous at %s has waited %.0f s: %s%s", s->where,
               MEET_SAY_MISSING_S, who, refused);
      if (how->warn) how->warn(how->warn_arg, line);
      else fprintf(stderr, "%s\n", line);
    }
    if (how->interrupt && how->interrupt(how->interrupt_arg)) {
      snprintf(err, errlen, "interrupted while member 0 waited at %s for the other nodes", s->where);
      return COLL_EINTERRUPTED;
    }
    for (int k = s->nshakes - 1; k >= 0; k--) /* handshakes past their own deadline */
      if (now >= s->shakes[k].deadline) meet_drop(s, k, NULL);
    struct pollfd p[MEET_MAX_SHAKES + 1];
    p[0] = (struct pollfd){.fd = srv, .events = POLLIN};
    for (int k = 0; k < s->nshakes; k++) p[k + 1] = (struct pollfd){.fd = s->shakes[k].fd, .events = POLLIN};
    int nshakes = s->nshakes;
    if (poll(p, (nfds_t)nshakes + 1, 100) <= 0) continue;
    for (int k = nshakes - 1; k >= 0 && verdict == 0; k--) {
      if (!p[k + 1].revents || meet_feed(s, k) != 1) continue;
      verdict = how->complete(how->arg, s->blobs, s->n, text, sizeof text);
    }
    if (p[0].revents) meet_accept(s, srv);
  }
  /* every member gets the verdict: all blobs, or the one error */
  size_t len = 0;
  uint8_t *msg = NULL;
  if (verdict > 0) {
    qsort(s->blobs, (size_t)s->n, sizeof *s->blobs, meet_cmp);
    msg = meet_pack(s->blobs, s->n, &len);
  } else if ((msg = malloc(strlen(text) + 2)) != NULL) {
    msg[0] = 'E', memcpy(msg + 1, text, strlen(text) + 1), len = strlen(text) + 1;
  }
  if (msg == NULL) return snprintf(err, errlen, "out of memory at the rendezvous"), -ENOMEM;
  uint8_t head[4];
  meet_put32(head, (uint32_t)len);
  for (int i = 0; i < s->n - 1; i++) {
    struct timeval tv = {.tv_sec = (time_t)MEET_HANDSHAKE_S};
    fcntl(s->socks[i], F_SETFL, fcntl(s->socks[i], F_GETFL) & ~O_NONBLOCK);
    setsockopt(s->socks[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (meet_send(s->socks[i], head, 4) == 0) (void)meet_send(s->socks[i], msg, len); /* one gone: its watch fires */
  }
  free(msg);
  if (verdict < 0) return snprintf(err, errlen, "%s", text), verdict;
  return 0;
}

static int meet_listen(const char *addr, int port, const char *at, int *fd_p, char *err, size_t errlen) {
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  int rc = coll__addr_resolve(addr, port, &sa, &sl);
  int fd = rc == 0 ? socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0) : -1, on = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  int sys = rc ? EADDRNOTAVAIL : fd < 0 ? errno : 0;
  if (!sys && (bind(fd, (struct sockaddr *)&sa, sl) != 0 || listen(fd, 128) != 0)) sys = errno;
  if (sys) {
    if (fd >= 0) close(fd);
    snprintf(err, errlen, "member 0 cannot listen at %s (%s): the rendezvous address (MASTER_ADDR, "
             "HBMCOLL_MASTER) must be this node's, and the port (HBMCOLL_PORT) free", at, strerror(sys));
    return COLL_EBOOTSTRAP;
  }
  *fd_p = fd;
  return 0;
}

/* ---- member k ---- */
static int meet_connect(int me, const char *addr, int port, double deadline, const coll__nodes_meet_t *how,
                        int *fd_p, char *err, size_t errlen) {
  struct sockaddr_storage sa;
  socklen_t sl = sizeof sa;
  char at[300];
  coll__addr_join(addr, port, at, sizeof at);
  if (coll__addr_resolve(addr, port, &sa, &sl) != 0)
    return snprintf(err, errlen, "member %d: the rendezvous address %s does not resolve", me, at), COLL_EBOOTSTRAP;
  for (;;) {
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return snprintf(err, errlen, "member %d: socket: %s", me, strerror(errno)), -errno;
    if (connect(fd, (struct sockaddr *)&sa, sl) == 0) {
      meet_keepalive(fd);
      *fd_p = fd;
      return 0;
    }
    close(fd);
    if (deadline > 0 && meet_now() > deadline)
      return snprintf(err, errlen, "member %d found no member 0 listening at %s in time", me, at),
             COLL_EBOOTSTRAP;
    if (how->interrupt && how->interrupt(how->interrupt_arg))
      return snprintf(err, errlen, "interrupted while member %d looked for member 0 at %s", me, at),
             COLL_EINTERRUPTED;
    struct timespec nap = {0, 50000000};
    nanosleep(&nap, NULL);
  }
}

static int meet_join(int me, const char *addr, int port, const char *secret, const uint8_t *blob, size_t len,
                     const coll__nodes_meet_t *how, double deadline, coll__nodes_blob_t **blobs_p, int *n_p,
                     int *fd_p, char *err, size_t errlen) {
  uint8_t head[MEET_HEAD], nonce0[MEET_NONCE];
  char at[300];
  coll__addr_join(addr, port, at, sizeof at);
  memcpy(head, MEET_MAGIC, MEET_MAGIC_LEN);
  meet_put32(head + MEET_MAGIC_LEN, (uint32_t)me);
  if (getrandom(head + MEET_MAGIC_LEN + 4, MEET_NONCE, 0) != MEET_NONCE) return -errno;
  const uint8_t *nonce_k = head + MEET_MAGIC_LEN + 4;
  uint8_t proof[32], answer[1 + 32], want[32], n4[4];
  int fd = -1, rc;
  for (;;) { /* member 0 may close a connection unanswered (a flood pushed it out): again */
    if ((rc = meet_connect(me, addr, port, deadline, how, &fd, err, errlen)) != 0) return rc;
    rc = meet_send(fd, head, sizeof head);
    if (rc == 0) rc = meet_recv(fd, nonce0, sizeof nonce0, deadline, how);
    if (rc == 0) {
      meet_proof(secret, "client", nonce0, nonce_k, head, (const uint8_t *)"", 0, proof);
      rc = meet_send(fd, proof, sizeof proof);
    }
    if (rc == 0) rc = meet_recv(fd, answer, sizeof answer, deadline, how);
    if (rc == 0) break;
    close(fd);
    if (rc == COLL_EINTERRUPTED) return snprintf(err, errlen, "interrupted at the rendezvous"), rc;
    if (deadline > 0 && meet_now() > deadline)
      return snprintf(err, errlen, "member %d: member 0 at %s never answered in time", me, at),
             COLL_EBOOTSTRAP;
    struct timespec nap = {0, 100000000};
    nanosleep(&nap, NULL);
  }
  if (answer[0] == 'R') {
    close(fd);
    return snprintf(err, errlen, "member %d: member 0 at %s holds another secret than ours: refused (is "
                    "HBMCOLL_JOB_KEY the same on every node?)", me, at), COLL_EBOOTSTRAP;
  }
  meet_proof(secret, "server", nonce_k, nonce0, NULL, NULL, 0, want);
  if (answer[0] != 'P' || !meet_same(want, answer + 1, 32)) {
    close(fd);
    return snprintf(err, errlen, "the listener at %s does not hold the job's secret: refused", at),
           COLL_EBOOTSTRAP;
  }
  meet_put32(n4, (uint32_t)len); /* it proved itself: our blob, and its proof */
  meet_proof(secret, "blob", nonce0, nonce_k, head, blob, len, proof);
  rc = meet_send(fd, n4, 4);
  if (rc == 0) rc = meet_send(fd, blob, len);
  if (rc == 0) rc = meet_send(fd, proof, sizeof proof);
  uint8_t *verdict = NULL;
  if (rc == 0) rc = meet_recv(fd, n4, 4, deadline, how);
  if (rc == 0 && (meet_get32(n4) > MEET_VERDICT_LIMIT || meet_get32(n4) == 0)) rc = -EPROTO;
  if (rc == 0 && (verdict = malloc(meet_get32(n4) + 1)) == NULL) rc = -ENOMEM;
  if (rc == 0) rc = meet_recv(fd, verdict, meet_get32(n4), deadline, how);
  if (rc) {
    close(fd);
    free(verdict);
    if (rc == COLL_EINTERRUPTED || rc == -ENOMEM) return snprintf(err, errlen, "%s at the rendezvous", coll_strerror(rc)), rc;
    return snprintf(err, errlen, "member %d: member 0 at %s refused or dropped us (%s); is the job's secret the "
                    "same on every node?", me, at, rc == -ETIMEDOUT ? "timed out" : strerror(-rc)),
           COLL_EBOOTSTRAP;
  }
  size_t vlen = meet_get32(n4);
  if (verdict[0] != 'O') {
    verdict[vlen] = '\0';
    snprintf(err, errlen, "%s", (const char *)verdict + 1);
    close(fd);
    free(verdict);
    return COLL_EBOOTSTRAP;
  }
  rc = meet_unpack(verdict + 1, vlen - 1, blobs_p, n_p);
  free(verdict);
  if (rc) {
    close(fd);
    return snprintf(err, errlen, "member %d: member 0 at %s sent a verdict that does not parse", me, at), rc;
  }
  *fd_p = fd;
  return 0;
}

int coll__nodes_meet(int me, const char *addr, int port, const char *secret, const uint8_t *blob, size_t len,
                     const coll__nodes_meet_t *how, double timeout_s, coll__nodes_blob_t **blobs_p, int *n_p,
                     coll__nodes_watch_t **watch_p, char *err, size_t errlen) {
  double deadline = timeout_s > 0 ? meet_now() + timeout_s : 0;
  int rc;
  if (me != 0) {
    coll__nodes_blob_t *blobs = NULL;
    int n = 0, fd = -1;
    if ((rc = meet_join(me, addr, port, secret, blob, len, how, deadline, &blobs, &n, &fd, err, errlen)) != 0)
      return rc;
    if ((rc = coll__nodes_watch_start(&fd, 1, 0, watch_p)) != 0) {
      coll__nodes_blobs_free(blobs, n);
      return snprintf(err, errlen, "member %d: the watch of the other nodes: %s", me, strerror(-rc)), rc;
    }
    *blobs_p = blobs, *n_p = n;
    return 0;
  }
  int srv = -1;
  char where[300];
  coll__addr_join(addr, port, where, sizeof where);
  if (how->listener > 0) {
    srv = fcntl(how->listener, F_DUPFD_CLOEXEC, 3); /* closed below, as one of its own */
    if (srv < 0 || fcntl(srv, F_SETFL, fcntl(srv, F_GETFL) | O_NONBLOCK) != 0) {
      int sys = errno;
      if (srv >= 0) close(srv);
      snprintf(err, errlen, "member 0 cannot take its listener at %s: %s", where, strerror(sys));
      return COLL_EBOOTSTRAP;
    }
  } else if ((rc = meet_listen(addr, port, where, &srv, err, errlen)) != 0)
    return rc;
  meet_serve_t s = {.where = where, .secret = secret, .how = how};
  s.blobs = malloc(sizeof *s.blobs);
  uint8_t *mine = malloc(len + 1);
  if (!s.blobs || !mine) rc = -ENOMEM, snprintf(err, errlen, "out of memory at the rendezvous");
  else {
    memcpy(mine, blob, len);
    s.blobs[0] = (coll__nodes_blob_t){.member = 0, .blob = mine, .len = len}, s.n = 1, mine = NULL;
    rc = how->complete(how->arg, s.blobs, s.n, err, errlen); /* a job of one node */
    rc = rc < 0 ? rc : rc == 1 ? 0 : meet_serve(&s, srv, deadline, err, errlen);
  }
  free(mine);
  while (s.nshakes) meet_drop(&s, s.nshakes - 1, NULL); /* strangers still proving nothing */
  close(srv);
  if (rc == 0 && (rc = coll__nodes_watch_start(s.socks, s.n - 1, 1, watch_p)) != 0)
    snprintf(err, errlen, "member 0: the watch of the other nodes: %s", strerror(-rc));
  else if (rc != 0)
    for (int i = 0; i < s.n - 1; i++) close(s.socks[i]);
  free(s.socks);
  if (rc) {
    coll__nodes_blobs_free(s.blobs, s.n);
    return rc;
  }
  *blobs_p = s.blobs, *n_p = s.n;
  return 0;
}
